"""What the fault tests share: the issue's timings, real processes, and the checks that
every item has exactly one result and the job was finalized once."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

from sqlalchemy import func, select

from core.util.faults import stall_file
from core.vocab import STALL_MARKER
from db.models import Chunk, Job, JobEvent, Result
from db.session import session_scope
from jobs.submit import submit_job
from tests.e2e.procs import BIN, Proc, start_worker, wait_for

# The timings the issue names: a 30 s chunk limit (visibility timeout 2 * 30 + 60 s) and a
# reconciler every 5 s. A job must complete within two minutes once a worker runs again.
FAST = {"LANEWAY_CHUNK_TIMEOUT": "30", "LANEWAY_RECONCILE_INTERVAL": "5"}
RECOVERY_DEADLINE = 120
# A worker that stops beating counts as dead after three missed heartbeats and 5 s: 11 s at
# a 2 s heartbeat, not the default's 20 s, which every test that kills one waits out. Every
# process of such a test gets it (the reconciler judges by its own setting).
QUICK_DEATH = {"LANEWAY_WORKER_HEARTBEAT": "2"}
LONG_TEXT = " ".join(["the parcel arrived late and the box was crushed again"] * 25)
FINAL = ("succeeded", "partial", "failed", "cancelled")


def submit(settings, account, n: int, prefix: str = "k", text: str = LONG_TEXT) -> uuid.UUID:
    items = [(f"{prefix}{i}", f"{text} #{i}") for i in range(n)]
    return submit_job(account, items, settings=settings).id


def stall_items(n: int, stalled: int, prefix: str = "s") -> list[tuple[str, str]]:
    """n texts of one length (so their length order is their input order) where item
    `stalled` carries the stall marker: with LANEWAY_FAULTS=stall, its chunk is held."""
    filler = "x" * len(STALL_MARKER)
    return [
        (f"{prefix}{i}", f"order {i:04d} {STALL_MARKER if i == stalled else filler} arrived")
        for i in range(n)
    ]


FORWARD = Path(__file__).with_name("forward.py")


def forwarder(
    listen: str, targets: list[str], logdir: Path, name: str, port: int = 0
) -> tuple[Proc, dict[str, int]]:
    """tests/faults/forward.py on `listen`; returns it and the port it listens on per target."""
    argv = [sys.executable, str(FORWARD), "--listen", listen, *targets]
    if port:
        argv += ["--port", str(port)]
    proc = Proc(name, argv, logdir)

    def ports():
        for line in proc.log.read_text().splitlines():
            if line.startswith("FORWARD "):
                return json.loads(line.removeprefix("FORWARD "))
        return None

    return proc, wait_for(ports, 20, f"the forwarder {name}", [proc])


def cpu_worker(logdir: Path, log_name: str, env=None, name: str = "cpu", **kw) -> Proc:
    argv = [str(BIN / "laneway"), "worker", "cpu", "--name", name]
    return start_worker(name, argv, logdir, env={**FAST, **(env or {})}, log_name=log_name, **kw)


def beat(logdir: Path, log_name: str = "beat", env=None) -> Proc:
    return Proc(log_name, [str(BIN / "laneway"), "beat"], logdir, {**FAST, **(env or {})})


def wait_running_chunk(settings, job_id, procs) -> int:
    """Wait until one of the job's chunks is running; return its id."""

    def running():
        with session_scope(settings) as session:
            return session.scalar(
                select(Chunk.id).where(Chunk.job_id == job_id, Chunk.state == "running")
            )

    return wait_for(running, 60, "a chunk to start", procs)


# A worker that holds a marked chunk in its model stage while the stall file exists.
HOLDS = {"LANEWAY_FAULTS": "stall"}


def submit_held(settings, account, n: int, held: int = 0) -> uuid.UUID:
    """A job of n short texts whose item `held` holds its chunk in the model stage, on a
    worker with HOLDS, until the test removes stall_file(settings) (made here)."""
    stall_file(settings).touch()
    return submit_job(account, stall_items(n, held), settings=settings).id


def wait_held_chunk(settings, job_id, proc) -> int:
    """Wait until `proc` (one chunk at a time) holds the job's marked chunk in its model
    stage; return that chunk's id. Killed now, it dies mid-chunk for certain, however fast
    the CPU runs the chunks before it."""
    wait_for(lambda: "stalling the model stage" in proc.log.read_text(), 60,
             "the marked chunk to be held", [proc])  # fmt: skip
    return wait_running_chunk(settings, job_id, [proc])


def wait_under_way(settings, job_id, procs, queued: int = 2) -> None:
    """Wait until one of the job's chunks is done and `queued` others still wait."""

    def under_way() -> bool:
        states = chunk_states(settings, job_id)
        return states.count("done") >= 1 and states.count("queued") >= queued

    wait_for(under_way, 120, "the job to be under way", procs,
             report=lambda: job_report(settings, job_id))  # fmt: skip


def assert_recovered(settings, job_id, n: int, status: str) -> None:
    """The job succeeded, every item has one result, and it was finalized once."""
    assert status == "succeeded", status
    assert_exactly_one_result_each(settings, job_id, n)
    assert len(events(settings, job_id, "finalized")) == 1


def chunk_states(settings, job_id) -> list[str]:
    with session_scope(settings) as session:
        return list(
            session.scalars(select(Chunk.state).where(Chunk.job_id == job_id).order_by(Chunk.seq))
        )


def wait_final(settings, job_id, timeout: float, procs) -> str:
    def final():
        with session_scope(settings) as session:
            status = session.get(Job, job_id).status
        return status if status in FINAL else None

    return wait_for(
        final, timeout, f"job {job_id} to end", procs, report=lambda: job_report(settings, job_id)
    )


def job_report(settings, job_id) -> str:
    """The job and its chunks as the database sees them (for a failure's message)."""
    with session_scope(settings) as session:
        job = session.get(Job, job_id)
        chunks = session.scalars(select(Chunk).where(Chunk.job_id == job_id).order_by(Chunk.seq))
        lines = [f"job {job_id}: {job.status if job else None}"]
        lines += [
            f"chunk {c.seq} ({c.id}): {c.state}/{c.stage} attempts={c.attempts} "
            f"worker={c.worker} queued_at={c.queued_at} finished_at={c.finished_at}"
            for c in chunks
        ]
    return "\n".join(lines)


def assert_exactly_one_result_each(settings, job_id, n: int, failed=frozenset()) -> None:
    """Every item has one result (the primary key makes two impossible: count them all),
    and exactly the items in `failed` carry an error."""
    with session_scope(settings) as session:
        rows = session.execute(
            select(Result.idx, Result.item_id, Result.error).where(Result.job_id == job_id)
        ).all()
    assert sorted(r.idx for r in rows) == list(range(n))
    assert {r.item_id for r in rows if r.error} == set(failed)


def events(settings, job_id, kind: str) -> list[dict]:
    with session_scope(settings) as session:
        return [
            e.detail or {}
            for e in session.scalars(
                select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == kind)
            )
        ]


def done_chunks(settings, job_id) -> int:
    with session_scope(settings) as session:
        return session.scalar(
            select(func.count()).where(Chunk.job_id == job_id, Chunk.state == "done")
        )
