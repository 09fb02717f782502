"""Traces from the real processes: gunicorn, a cpu worker and the interactive worker export
their spans over OTLP/HTTP to a receiver in the test, and one trace joins them."""

from __future__ import annotations

import sys
import time
import uuid

import pytest
from sqlalchemy import select

from db.models import Chunk
from db.session import session_scope
from tests.e2e.otlp import Receiver, Span
from tests.e2e.procs import BIN, Proc, free_port, http, start_web, start_worker, wait_for
from tests.faults.harness import cpu_worker

pytestmark = pytest.mark.e2e
FINAL = ("succeeded", "partial", "failed", "cancelled")


def _one(spans: list[Span], **match) -> Span | None:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) <= 1, found
    return found[0] if found else None


def _job_trace(receiver: Receiver, job_id: str, expected: dict[str, int]):
    """The job's spans by name (those in the trace of the web's POST /v1/jobs span), once
    `expected` many of each name have arrived; else None."""
    spans = receiver.received()
    post = [s for s in spans if s.name == "POST /v1/jobs"]
    post = [s for s in post if s.attributes.get("laneway.job") == job_id]
    if not post:
        return None
    named: dict[str, list[Span]] = {}
    for span in spans:
        if span.trace_id == post[0].trace_id:
            named.setdefault(span.name, []).append(span)
    counts_ok = all(len(named.get(name, [])) >= n for name, n in expected.items())
    return named if counts_ok else None


def _submit(url: str, headers: dict, n: int) -> str:
    items = [{"id": str(i), "text": f"my parcel {i} arrived late ({uuid.uuid4().hex})"}
             for i in range(n)]  # fmt: skip
    r = http.post(f"{url}/v1/jobs", json={"items": items}, headers=headers)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _wait_succeeded(url: str, headers: dict, job_id: str, procs) -> None:
    def finished() -> dict | None:
        body = http.get(f"{url}/v1/jobs/{job_id}", headers=headers).json()
        return body if body["status"] in FINAL else None

    assert wait_for(finished, 180, "the job", procs)["status"] == "succeeded"


def _children(named: dict[str, list[Span]], parent: Span) -> dict[str, Span]:
    found = [s for spans in named.values() for s in spans if s.parent_id == parent.span_id]
    return {s.name: s for s in found}


def _headers(account_factory) -> dict[str, str]:
    _, key = account_factory()
    return {"Authorization": f"Bearer {key}"}


def _traced(receiver: Receiver, **extra: str) -> dict[str, str]:
    """A process's environment: spans to the receiver within 0.2 s, three chunks for five
    items."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "LANEWAY_CHUNK_SIZE": "2",
        **extra,
    }


def test_one_trace_from_the_web_through_the_workers(settings, account_factory, tmp_path):
    headers = _headers(account_factory)
    with Receiver() as receiver:
        env = _traced(receiver)
        web, url = start_web(tmp_path, env)
        worker = cpu_worker(tmp_path, "cpu-traced", env=env)
        argv = [str(BIN / "laneway"), "worker", "interactive", "--name", "interactive-traced"]
        interactive = start_worker("interactive-traced", argv, tmp_path, env=env)
        procs = [web, worker, interactive]

        job_id = _submit(url, headers, 5)
        _wait_succeeded(url, headers, job_id, procs)
        with session_scope(settings) as session:
            rows = session.execute(
                select(Chunk.id, Chunk.model_seconds).where(Chunk.job_id == uuid.UUID(job_id))
            ).all()
        model_seconds = {chunk_id: seconds for chunk_id, seconds in rows}
        assert len(model_seconds) == 3
        expected = {"run/laneway.run_chunk": 3, "pre": 3, "model": 3, "post": 3}
        named = wait_for(lambda: _job_trace(receiver, job_id, expected), 60, "spans", procs)

        # The web process's request and the worker's tasks share the trace.
        (post,) = named["POST /v1/jobs"]
        assert post.service == "laneway-web"
        runs = named["run/laneway.run_chunk"]
        assert {s.service for s in runs} == {"laneway-worker-cpu"}
        assert {s.attributes["laneway.chunk"] for s in runs} == set(model_seconds)
        assert {s.attributes["laneway.job"] for s in runs} == {job_id}
        # Each chunk's stages are children of its task's span, with the seconds the chunk
        # recorded (the job's stage_seconds come from the same figures).
        for run in runs:
            stages = _children(named, run)
            assert {"pre", "model", "post"} <= set(stages), stages
            chunk = run.attributes["laneway.chunk"]
            assert stages["model"].attributes["laneway.seconds"] == pytest.approx(
                model_seconds[chunk]
            )
            assert stages["model"].attributes["laneway.seconds"] > 0

        # A sync request: the web's span, the interactive worker's span of that request in
        # the same trace, and the batch that served it linked to the request.
        body = {"items": [{"id": "a", "text": f"where is my refund ({uuid.uuid4().hex})"}]}
        r = http.post(f"{url}/v1/embed", json=body, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["cached"] is False

        def sync_spans() -> tuple[Span, Span, Span] | None:
            spans = receiver.received()
            request = [s for s in spans if s.name == "POST /v1/embed"]
            if not request:
                return None
            (request,) = request
            served = _one(spans, name="interactive.request", trace_id=request.trace_id)
            batches = [s for s in spans if s.name == "interactive.batch"]
            linked = [b for b in batches if (request.trace_id, request.span_id) in b.links]
            return (request, served, linked[0]) if served and linked else None

        request, served, batch = wait_for(sync_spans, 60, "the sync request's spans", procs)
        assert request.service == "laneway-web"
        assert served.parent_id == request.span_id
        assert served.service == batch.service == "laneway-worker-interactive.cpu"
        assert batch.trace_id != request.trace_id  # a batch serves many traces: links
        assert batch.attributes["laneway.batch_items"] >= 1
        stages = {s.name for s in receiver.received() if s.parent_id == batch.span_id}
        assert stages == {"pre", "model", "post"}
        # Probes and scrapes are not traced: a busy fleet's health checks are not traces.
        assert not [s for s in receiver.received() if s.name.endswith("/healthz")]


def test_the_gpu_lane_traces_each_stage_on_the_worker_that_ran_it(
    settings, account_factory, tmp_path
):
    """The gpu lane's chain (prep on a cpu worker, model on a gpu worker, post on a cpu
    worker) inside the job's chord: every task of every chunk in the web request's trace,
    each a child of the task that sent it. CPU fallback: no GPU here."""
    headers = _headers(account_factory)
    with Receiver() as receiver:
        # Five items go to the gpu lane, whose worker runs on CPU.
        env = _traced(receiver, LANEWAY_GPU_THRESHOLD="3", LANEWAY_GPU_FALLBACK="cpu")
        web, url = start_web(tmp_path, env)
        worker = cpu_worker(tmp_path, "cpu-traced-gpu-lane", env=env)
        argv = [str(BIN / "laneway"), "worker", "gpu", "--device", "0"]
        gpu = start_worker("gpu0", argv, tmp_path, env=env, log_name="gpu-traced")
        procs = [web, worker, gpu]
        job_id = _submit(url, headers, 5)
        _wait_succeeded(url, headers, job_id, procs)
        tasks = ("prep", "model", "post")
        expected = {f"run/laneway.{t}_chunk": 3 for t in tasks}
        named = wait_for(lambda: _job_trace(receiver, job_id, expected), 60, "spans", procs)

    (post,) = named["POST /v1/jobs"]
    assert post.attributes["laneway.lane"] == "gpu"
    services = {"prep": "laneway-worker-cpu", "model": "laneway-worker-gpu",
                "post": "laneway-worker-cpu"}  # fmt: skip
    by_id = {s.span_id: s for spans in named.values() for s in spans}
    for task, stage in zip(tasks, ("pre", "model", "post"), strict=True):
        for run in named[f"run/laneway.{task}_chunk"]:
            assert run.service == services[task]
            assert run.attributes["laneway.job"] == job_id
            assert _children(named, run)[stage].attributes["laneway.seconds"] > 0
            # Sent by the web request (prep) or by the stage before it, through the
            # publish span the Celery instrumentation makes on the sending side.
            sender = by_id[by_id[run.parent_id].parent_id]
            before = {"prep": "POST /v1/jobs", "model": "run/laneway.prep_chunk",
                      "post": "run/laneway.model_chunk"}  # fmt: skip
            assert sender.name == before[task], sender


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL='grpc'"),
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER='jaeger'"),
    ],
)
def test_a_tracing_setting_laneway_cannot_honour_stops_each_process_by_name(tmp_path, bad, named):
    """A hurried operator's setting is refused at start-up, naming it: never a fleet that
    runs without the traces it was asked for, nor a crash loop of pool children. `laneway`
    refuses it before it starts the process (fleet/cli/common.py process_settings)."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", **bad}
    argv = [str(BIN / "laneway"), "worker", "cpu", "--name", "cpu-bad-otel"]
    procs = [Proc("worker-bad-otel", argv, tmp_path, env)]
    procs.append(Proc("web-bad-otel", [str(BIN / "laneway"), "web", "--port", "0"], tmp_path, env))
    procs.append(Proc("beat-bad-otel", [str(BIN / "laneway"), "beat"], tmp_path, env))
    for proc in procs:
        try:
            proc.proc.wait(120)
        finally:
            proc.stop()
        assert proc.proc.returncode != 0, proc.tail()
        assert named in proc.log.read_text(), proc.tail()


def test_a_worker_started_without_laneway_refuses_the_setting_itself(tmp_path):
    """A Celery worker started by hand (or by another supervisor) checks the variables at
    its own start (workers/signals.py), as `laneway` does before starting one."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "jaeger"}
    argv = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "cpu", "-n",
            "cpu-bad-otel@%h", "-c", "1"]  # fmt: skip
    proc = Proc("celery-bad-otel", argv, tmp_path, env)
    try:
        proc.proc.wait(120)
    finally:
        proc.stop()
    assert proc.proc.returncode != 0, proc.tail()
    assert "OTEL_TRACES_EXPORTER='jaeger'" in proc.log.read_text(), proc.tail()


def test_a_collector_that_is_down_costs_the_requests_nothing(account_factory, tmp_path):
    """Spans to a port nobody listens on: the exporter's failures stay in its own thread
    (its retries would take seconds), and requests are answered and stored as ever."""
    headers = _headers(account_factory)
    down = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    web, url = start_web(tmp_path, down)
    try:
        for _ in range(3):
            started = time.monotonic()
            job_id = _submit(url, headers, 2)
            r = http.get(f"{url}/v1/jobs/{job_id}", headers=headers)
            assert r.status_code == 200 and r.json()["id"] == job_id, r.text
            assert time.monotonic() - started < 5
        # Tracing was on: the exporter says it could not reach the collector.
        wait_for(lambda: "exporting spans" in web.log.read_text(), 60, "the export failures", [web])
    finally:
        web.stop()
