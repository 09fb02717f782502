"""What a job ran with and what it cost, against the real Postgres and Redis: each chunk's
stage record carries its precision and runtime, the job document sums them up, and the
cost follows the measured model seconds."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import update

from core.config.settings import Settings
from db.models import Chunk, Job
from db.results import finalize_job, job_runtimes
from db.session import session_scope
from inference.precision import choose, runtime_label
from tests.factories import stored_job
from tests.integration.conftest import auth
from tests.integration.test_pages import BASE, _login

TEXTS = ["my card was charged twice", "the box arrived late", "love the app", "cannot log in"]


def test_a_cpu_chunk_records_its_precision_and_the_job_document_shows_it(
    client, account_factory, settings
):
    from tasks.chunks import run_chunk

    _, key = account_factory("standard")
    items = [{"id": f"t{i}", "text": t} for i, t in enumerate(TEXTS)]
    body = client.post(
        "/v1/jobs", json={"tasks": ["classify", "score"], "items": items}, headers=auth(key)
    ).json
    job_id = uuid.UUID(body["id"])
    # Before any chunk ran: nothing to show yet.
    job = client.get(body["links"]["self"], headers=auth(key)).json
    assert (job["precision"], job["runtimes"]) == (None, [])

    with session_scope(settings) as session:
        chunk_id = session.query(Chunk.id).filter_by(job_id=job_id).scalar()
    run_chunk.apply(args=(chunk_id,)).get()

    # The precision this CPU gets by default: bf16 where it computes bf16 natively.
    expected = choose(Settings().precision, "cpu").precision
    runtime = runtime_label(expected, "cpu")
    with session_scope(settings) as session:
        chunk = session.get(Chunk, chunk_id)
        assert (chunk.state, chunk.device) == ("done", "cpu")
        assert (chunk.precision, chunk.runtime) == (expected, runtime)
        # The worker's share of this host's CPU: its torch threads over the usable cores.
        assert chunk.cpu_cores == settings.torch_threads  # the cores the worker held
        model_seconds = chunk.model_seconds
    job = client.get(body["links"]["self"], headers=auth(key)).json
    assert job["status"] == "succeeded"
    assert job["precision"] == expected
    assert job["runtimes"] == [
        {
            "runtime": runtime,
            "precision": expected,
            "device": "cpu",
            "chunks": 1,
            "model_seconds": round(model_seconds, 3),
        }
    ]
    assert job["cost"]["seconds"]["model_cpu"] == round(model_seconds, 3)


def test_a_chunks_cpu_seconds_are_priced_per_core_its_worker_held(settings, migrated):
    """Two chunks written before cores were recorded (one each), two by a worker of two
    torch threads, two on a GPU whose worker holds four cores: CPU seconds at the CPU price
    times the cores, a GPU's model seconds at the GPU price; the seconds the job shows are
    the stages' own."""
    job_id, chunk_ids = stored_job(settings, [f"text {i}" for i in range(12)], chunk_size=2)
    stages = {"pre_seconds": 0.5, "model_seconds": 2.0, "post_seconds": 0.25, "state": "done"}
    _set_chunks(settings, chunk_ids[:2], device="cpu", cpu_cores=None, **stages)
    _set_chunks(settings, chunk_ids[2:4], device="cpu", cpu_cores=2, **stages)
    _set_chunks(settings, chunk_ids[4:], device="cuda", cpu_cores=4, **stages)
    with session_scope(settings) as session:
        finalize_job(session, job_id, cpu_price=0.01, gpu_price=0.1)
        cost = session.get(Job, job_id).cost
    assert cost["by_stage"]["pre"] == pytest.approx((2 * 1 + 2 * 2 + 2 * 4) * 0.5 * 0.01)
    assert cost["by_stage"]["model"] == pytest.approx((2 + 2 * 2) * 2.0 * 0.01 + 2 * 2.0 * 0.1)
    assert cost["by_stage"]["post"] == pytest.approx((2 + 2 * 2 + 2 * 4) * 0.25 * 0.01)
    assert cost["total"] == pytest.approx(sum(cost["by_stage"].values()))
    assert cost["seconds"] == {"pre": 3.0, "model_cpu": 8.0, "model_gpu": 4.0, "post": 1.5}


def _set_chunks(settings, chunk_ids, **values):
    with session_scope(settings) as session:
        session.execute(update(Chunk).where(Chunk.id.in_(chunk_ids)).values(**values))


@pytest.mark.parametrize("model_seconds", [2.0, 1.0, 0.25])
def test_a_jobs_cost_is_reckoned_from_its_chunks_measured_seconds(
    settings, migrated, model_seconds
):
    # Four chunks of 4 items; every second at the CPU price. A faster precision (fewer
    # model seconds) makes the same job cheaper by exactly that.
    job_id, chunk_ids = stored_job(settings, [f"text {i}" for i in range(16)], chunk_size=4)
    _set_chunks(
        settings,
        chunk_ids,
        state="done",
        device="cpu",
        precision="bf16",
        runtime="torch 2.13.0 bf16 cpu",
        pre_seconds=0.5,
        model_seconds=model_seconds,
        post_seconds=0.25,
    )
    with session_scope(settings) as session:
        assert finalize_job(session, job_id, cpu_price=0.01, gpu_price=0.1) == "failed"
        cost = session.get(Job, job_id).cost
        runtimes = job_runtimes(session, job_id)
    total = 4 * (0.5 + model_seconds + 0.25) * 0.01
    assert cost["total"] == pytest.approx(total)
    assert cost["per_item"] == pytest.approx(total / 16)
    assert cost["by_stage"]["model"] == pytest.approx(4 * model_seconds * 0.01)
    assert cost["seconds"]["model_cpu"] == pytest.approx(4 * model_seconds)
    assert runtimes == [
        {
            "runtime": "torch 2.13.0 bf16 cpu",
            "precision": "bf16",
            "device": "cpu",
            "chunks": 4,
            "model_seconds": pytest.approx(4 * model_seconds),
        }
    ]


def test_chunks_that_ran_differently_make_a_mixed_job(client, app, account_factory, settings):
    _, key = account_factory("standard")
    items = [{"id": f"m{i}", "text": f"text number {i}"} for i in range(40)]
    body = client.post("/v1/jobs", json={"items": items}, headers=auth(key)).json
    with session_scope(settings) as session:
        ids = [c for (c,) in session.query(Chunk.id).filter_by(job_id=uuid.UUID(body["id"]))]
    assert len(ids) >= 2
    for chunks, device, precision in ((ids[:1], "cpu", "bf16"), (ids[1:], "cuda", "fp16")):
        runtime = f"torch 2.13.0 {precision} {device}"
        _set_chunks(settings, chunks, device=device, precision=precision, runtime=runtime)
    job = client.get(body["links"]["self"], headers=auth(key)).json
    assert job["precision"] == "mixed"
    assert [(r["precision"], r["chunks"]) for r in job["runtimes"]] == [
        ("fp16", len(ids) - 1),
        ("bf16", 1),
    ]
    # The job's page says what it ran with, too.
    browser = app.test_client()
    _login(browser, key)
    page = browser.get(f"/jobs/{body['id']}", base_url=BASE).data.decode()
    ran = f"torch 2.13.0 fp16 cuda ({len(ids) - 1} chunks); torch 2.13.0 bf16 cpu (1 chunk)"
    assert ran in page
