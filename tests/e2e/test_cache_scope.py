"""The batch path with a real cpu worker and the result cache on: a job never learns from
another account's earlier job of the same texts (its model still runs; the answers are the
model's, the same for both), while an account's own repeat comes from the cache."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from db.models import Job, Result
from db.session import session_scope
from jobs.submit import submit_job
from tests.e2e.procs import wait_for
from tests.faults.harness import cpu_worker
from webapp import create_app

pytestmark = pytest.mark.e2e


def _finished(settings, job_id):
    with session_scope(settings) as session:
        job = session.get(Job, job_id)
        return job if job.status in ("succeeded", "partial", "failed") else None


def _view(client, key: str, job_id) -> dict:
    response = client.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200
    return response.json


def _outputs(settings, job_id) -> list:
    with session_scope(settings) as session:
        rows = session.scalars(select(Result).where(Result.job_id == job_id).order_by(Result.idx))
        return [r.output for r in rows]


def test_batch_jobs_never_use_another_accounts_cache(settings, migrated, account_factory, tmp_path):
    (a, key_a), (b, key_b) = account_factory(), account_factory()
    texts = [f"account A's own words {uuid.uuid4().hex} #{n}" for n in range(3)]
    items = [(str(n), t) for n, t in enumerate(texts)]
    client = create_app(settings).test_client()
    worker = cpu_worker(tmp_path, "cpu-cache-scope", env={"LANEWAY_CACHE_TTL": "300"})
    try:
        jobs = {}
        for name, account in (("a", a), ("a again", a), ("b", b)):
            job_id = submit_job(account, items, tasks=["embed"], settings=settings).id
            wait_for(lambda j=job_id: _finished(settings, j), 180, f"job {name}", [worker])
            jobs[name] = job_id
    finally:
        worker.stop()
    model = {n: _view(client, key_b if n == "b" else key_a, j)["stage_seconds"]["model"]
             for n, j in jobs.items()}  # fmt: skip
    # A's repeat is answered from A's entries: no model time.
    assert model["a"] > 0 and model["a again"] == 0, model
    # B's identical job runs the model as if A had never sent it.
    assert model["b"] > 0, model
    # The same model's answers for both: nothing of A's reached B, nothing was lost.
    assert _outputs(settings, jobs["b"]) == _outputs(settings, jobs["a"])
    assert len(_outputs(settings, jobs["b"])) == 3
