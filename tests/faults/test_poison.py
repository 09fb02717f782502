"""Poison items through the real fleet: the model stage raises on them (LANEWAY_FAULTS=
poison); only they fail, the job ends partial, `laneway dlq list` shows them, and
`POST /v1/jobs/<id>/retry` sends them back to a fleet without the fault."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from core.vocab import POISON_MARKER
from tests.e2e.procs import BIN, http, start_web
from tests.faults.harness import (
    assert_exactly_one_result_each,
    cpu_worker,
    events,
    wait_final,
)

pytestmark = pytest.mark.e2e
POISONED = {"p3", "p20", "p21"}  # one in the first chunk of 16, two in the second


def test_poison_items_are_isolated_dead_lettered_and_retried(
    lanes, migrated, account_factory, tmp_path
):
    """On either broker: on RabbitMQ the chunk's retries wait out their countdowns in
    Celery's native delayed delivery, and its queues carry a delivery limit."""
    settings = lanes
    _, key = account_factory("trial")
    headers = {"Authorization": f"Bearer {key}"}
    items = [
        {
            "id": f"p{i}",
            "text": f"order {i} {POISON_MARKER} arrived broken"
            if f"p{i}" in POISONED
            else f"order {i} arrived broken and late",
        }
        for i in range(40)
    ]
    web, url = start_web(tmp_path)
    worker = cpu_worker(tmp_path, "cpu-poison", env={"LANEWAY_FAULTS": "poison"})
    try:
        job = http.post(f"{url}/v1/jobs", json={"items": items}, headers=headers).json()
        job_id = uuid.UUID(job["id"])
        assert wait_final(settings, job_id, 180, [web, worker]) == "partial"
        body = http.get(f"{url}/v1/jobs/{job_id}", headers=headers).json()
        assert body["counts"] == {"succeeded": 37, "failed": 3, "cancelled": 0}
        assert_exactly_one_result_each(settings, job_id, 40, failed=POISONED)

        letters = http.get(f"{url}/v1/jobs/{job_id}/dead-letters", headers=headers).json()
        letters = letters["dead_letters"]
        assert sorted(x["item_ids"][0] for x in letters) == sorted(POISONED)
        assert all(x["kind"] == "item" and "PoisonError" in x["error"] for x in letters)
        assert all(x["attempts"] == settings.chunk_retries + 1 for x in letters)

        listed = subprocess.run(
            [str(BIN / "laneway"), "dlq", "list", "--job", str(job_id)],
            capture_output=True,
            text=True,
            check=True,
            env=os.environ,
        )
        assert len(listed.stdout.splitlines()) == 3 and "3 dead letter(s)" in listed.stderr
        assert all(f"items={i}\t" in listed.stdout for i in POISONED)

        worker.stop()  # the cause goes away: a fleet without the fault takes the retry
        worker = cpu_worker(tmp_path, "cpu-healthy")
        retried = http.post(f"{url}/v1/jobs/{job_id}/retry", headers=headers)
        assert retried.status_code == 202, retried.text
        assert (retried.json()["retried_letters"], retried.json()["retried_items"]) == (3, 3)
        assert wait_final(settings, job_id, 180, [web, worker]) == "succeeded"
        again = http.post(f"{url}/v1/jobs/{job_id}/retry", headers=headers)
        assert again.status_code == 409
    finally:
        worker.stop()
        web.stop()
    assert_exactly_one_result_each(settings, job_id, 40)
    assert [e["status"] for e in events(settings, job_id, "finalized")] == ["partial", "succeeded"]
    broker = "rabbitmq" if settings.broker_is_rabbitmq else "redis"
    print(f"FIGURES poison ({broker}): items=40 poisoned={len(POISONED)} lost=0")
