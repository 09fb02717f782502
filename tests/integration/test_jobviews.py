"""The dashboard's figures from rows in the real Postgres and counters in the real Redis:
items per 5-minute bucket of the last hour, dollars per item by lane, and each worker's
state (busy or idle, and since when)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis
from sqlalchemy import select

from core.store import usage
from core.store.redis_conn import round_trip
from db.accounts import create_account
from db.intake import create_job
from db.models import Chunk
from db.session import session_scope
from jobs.planner import plan_chunks
from webapp import jobviews
from workers import registry

# An hour of its own, long past: no other test's chunks or counters fall in it.
NOW = datetime(2001, 2, 3, 12, 0, tzinfo=UTC)


def _done_chunks(
    session, lane: str, finished: list[timedelta | None], device: str, cores: int | None = None
) -> None:
    """A job of 10-item chunks on `lane`, each done `finished[k]` before NOW (None: the
    chunk failed), with 1 s pre, 2 s model and 1 s post each, by a worker holding `cores`
    (None: recorded before cores were)."""
    account, _ = create_account(session, f"dash-{uuid.uuid4().hex[:8]}", "standard")
    n = 10 * len(finished)
    job = create_job(
        session,
        account_id=account.id,
        tasks=["classify"],
        labels=["a", "b"],
        items=[(str(i), f"text {i}") for i in range(n)],
        lane=lane,
        chunks=plan_chunks(n, 10),
        chunk_size=10,
    )
    session.flush()
    chunks = session.scalars(select(Chunk).where(Chunk.job_id == job.id).order_by(Chunk.seq))
    for chunk, ago in zip(chunks, finished, strict=True):
        chunk.state = "failed" if ago is None else "done"
        chunk.finished_at = NOW - (ago or timedelta(minutes=1))
        chunk.device, chunk.pre_seconds, chunk.model_seconds, chunk.post_seconds = (
            device, 1.0, 2.0, 1.0
        )  # fmt: skip
        chunk.cpu_cores = cores
    session.flush()


def test_throughput_and_cost_count_the_chunks_done_in_the_hour(db_session, settings):
    minutes = timedelta(minutes=1)
    _done_chunks(db_session, "cpu", [2 * minutes, 3 * minutes, 7 * minutes, 61 * minutes,
                                     None], "cpu")  # fmt: skip
    _done_chunks(db_session, "gpu", [58 * minutes, -1 * minutes], "cuda")  # one after NOW
    series = jobviews.throughput(db_session, NOW)
    # Oldest bucket first: 55-60 minutes ago ... 0-5 minutes ago.
    assert series["cpu"] == [0] * 10 + [10, 20]
    assert series["gpu"] == [10] + [0] * 11
    priced = settings.replace(cpu_price=0.001, gpu_price=0.01)
    cost = jobviews.cost_per_item(db_session, priced, series, NOW)
    # Per chunk: 2 CPU seconds (pre and post) at the CPU price, 2 model seconds at its device's.
    assert cost["cpu"] == pytest.approx(3 * (2 * 0.001 + 2 * 0.001) / 30)
    assert cost["gpu"] == pytest.approx((2 * 0.001 + 2 * 0.01) / 10)
    # Two more cpu chunks in the hour by a worker holding two cores: twice their dollars.
    _done_chunks(db_session, "cpu", [4 * minutes, 6 * minutes], "cpu", cores=2)
    series = jobviews.throughput(db_session, NOW)
    cost = jobviews.cost_per_item(db_session, priced, series, NOW)
    assert cost["cpu"] == pytest.approx((3 * 0.004 + 2 * 2 * 0.004) / 50)
    nothing = jobviews.throughput(db_session, NOW - timedelta(hours=3))
    assert nothing == {"cpu": [0] * 12, "gpu": [0] * 12}
    assert jobviews.cost_per_item(db_session, priced, nothing, NOW - timedelta(hours=3)) == {
        "cpu": None,
        "gpu": None,
    }


def test_interactive_lanes_come_from_the_workers_per_minute_counters(settings):
    r = redis.Redis.from_url(settings.redis_url)
    at = NOW.timestamp()
    # Two batches in the last minute, one twelve minutes ago on CUDA, one over an hour ago.
    round_trip(r, usage.record_commands("interactive.cpu", 5, 0.5, 1.0, "cpu", now=at - 30))
    round_trip(r, usage.record_commands("interactive.cpu", 3, 0.25, 0.5, "cpu", now=at - 10))
    round_trip(r, usage.record_commands("interactive.cpu", 4, 0.25, 2.0, "cuda", now=at - 12 * 60))
    round_trip(r, usage.record_commands("interactive.cpu", 100, 9.0, 9.0, "cpu", now=at - 61 * 60))
    assert 0 < r.ttl(usage.minute_key("interactive.cpu", int((at - 30) // 60))) <= usage.TTL
    priced = settings.replace(cpu_price=0.001, gpu_price=0.01)
    series, cost = jobviews.interactive_usage(r, priced, NOW)
    assert series["interactive.cpu"] == [0] * 9 + [4, 0, 8]
    assert series["interactive.gpu"] == [0] * 12
    dollars = (0.5 + 0.25 + 1.0 + 0.5) * 0.001 + 0.25 * 0.001 + 2.0 * 0.01
    assert cost["interactive.cpu"] == pytest.approx(dollars / 12)
    assert cost["interactive.gpu"] is None


@pytest.fixture
def registered(settings, migrated):
    """Register workers as their heartbeat would; mark them stopped afterwards, so that no
    later test takes them for live ones."""
    made: list[str] = []

    def make(queues: list[str]) -> tuple[str, str]:
        hostname = f"{queues[0]}-{uuid.uuid4().hex[:6]}@dashboard-test"
        instance = registry.make_instance_id(hostname)
        registry.register(instance, hostname, queues, "cpu")
        made.append(instance)
        return instance, hostname

    yield make
    for instance in made:
        registry.stopped(instance, "test over")


def _state(settings, hostname: str) -> dict:
    with session_scope(settings) as session:
        workers = jobviews.live_workers(session, settings)
    (found,) = [w for w in workers if w["hostname"] == hostname]
    return found


def test_workers_show_busy_or_idle_since_when(settings, registered):
    chunks, chunk_host = registered(["cpu", "maintenance", "cpu@dashboard-test.dq2"])
    started = _state(settings, chunk_host)
    assert started["busy"] is False and started["since"] == started["started_at"]
    assert started["queues"] == "cpu, maintenance"  # not its own remote-control queue
    registry.task_started(chunks)
    busy = _state(settings, chunk_host)
    assert busy["busy"] is True and busy["since"] > started["started_at"]
    registry.task_started(chunks)  # a second chunk: still busy since the first began
    assert _state(settings, chunk_host)["since"] == busy["since"]
    registry.task_finished(chunks)
    registry.task_finished(chunks)
    idle = _state(settings, chunk_host)
    assert idle["busy"] is False and idle["since"] > busy["since"]

    # The interactive worker runs no chunk task: its heartbeat carries its batcher's state.
    interactive, host = registered(["interactive.cpu"])
    held_from = NOW + timedelta(seconds=5)
    registry.beat(interactive, (3, held_from))
    assert _state(settings, host) | {"started_at": None} == {
        "hostname": host,
        "queues": "interactive.cpu",
        "device": "cpu",
        "gpu_device": None,
        "busy": True,
        "since": held_from.isoformat(),
        "started_at": None,
    }
    idle_from = held_from + timedelta(seconds=2)
    registry.beat(interactive, (0, idle_from))
    after = _state(settings, host)
    assert after["busy"] is False and after["since"] == idle_from.isoformat()
    registry.beat(interactive)  # a plain beat leaves the state as it was
    assert _state(settings, host) == after
