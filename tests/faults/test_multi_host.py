"""One job over workers on two hosts, and one host cut off mid-job, then let back in late.

Each host is a network namespace joined to this machine by a veth pair (tests/faults/
netns.py), with its own hostname; its worker is the real `laneway worker cpu`, reaching
Redis and Postgres on this machine through a TCP forwarder on the host side of its pair
(tests/faults/forward.py). The job's chunks spread over both hosts. While one host holds a
chunk (LANEWAY_FAULTS=stall holds it) and most of the job still waits, that host's link
goes down; beat's reconciler, here on this machine, sees its worker stop beating and sends
its chunk again, and the other host runs it and the rest of the job: the job completes with
every item's result exactly once. Then the cut host's link comes back and its chunk is let
go: its worker finishes the chunk late and tries to write it, and nothing it wrote changes
a result row, the chunk or the job."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import select, text

from core.queueing.broker import snapshot
from core.queueing.celery_app import QUEUES
from core.store.redis_conn import redis_client
from core.util.faults import stall_file
from db.models import Chunk, Job, JobEvent
from db.session import session_scope
from jobs.submit import submit_job
from tasks import app
from tests.e2e.procs import BIN, Proc, wait_for, worker_ready
from tests.faults import netns
from tests.faults.harness import (
    FAST,
    QUICK_DEATH,
    assert_exactly_one_result_each,
    beat,
    events,
    forwarder,
    job_report,
    stall_items,
    wait_final,
)

pytestmark = pytest.mark.e2e

# The cut host's worker counts as dead soon (QUICK_DEATH). The cut host holds its chunk
# through the cut, the take-over and the rest of the job: a 120 s chunk limit keeps its time
# limits out of the way (the 30 s of FAST would end it early).
ENV = {**FAST, **QUICK_DEATH, "LANEWAY_CHUNK_TIMEOUT": "120"}
# Twelve chunks of 16; the second (items 16-31) is held on whichever host takes it.
ITEMS, STALLED = 192, 24


@pytest.fixture
def can_make_hosts():
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"multi-host test: {why}")


def via(url: str, host: str, ports: dict[str, int]) -> str:
    """`url` with its host:port replaced by the forwarder's address for it."""
    parts = urlsplit(url)
    target = f"{parts.hostname}:{parts.port}"
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@" if auth else ""
    return urlunsplit(parts._replace(netloc=f"{netloc}{host}:{ports[target]}"))


def host_forwarder(host: netns.Host, targets: list[str], logdir) -> tuple[Proc, dict[str, int]]:
    return forwarder(host.gateway, targets, logdir, f"forward-{host.hostname}")


def chunk_rows(settings, job_id) -> dict[int, tuple]:
    """seq -> (state, worker, task_id, attempts, finished_at) of each of the job's chunks."""
    with session_scope(settings) as session:
        rows = session.execute(
            select(
                Chunk.seq,
                Chunk.state,
                Chunk.worker,
                Chunk.task_id,
                Chunk.attempts,
                Chunk.finished_at,
            ).where(Chunk.job_id == job_id)
        ).all()
    return {r.seq: tuple(r[1:]) for r in rows}


def written(settings, job_id) -> dict[str, object]:
    """What a late write would change: each result row's version (Postgres' xmin, new with
    every insert or update of the row, ON CONFLICT DO UPDATE included), the job's row, its
    chunks and its events."""
    with session_scope(settings) as session:
        results = dict(
            session.execute(
                text("SELECT idx, xmin::text FROM results WHERE job_id = :job"), {"job": job_id}
            ).all()
        )
        job = session.execute(
            select(
                text("jobs.xmin::text"),
                Job.status,
                Job.succeeded_items,
                Job.failed_items,
                Job.cancelled_items,
                Job.label_counts,
                Job.finished_at,
            ).where(Job.id == job_id)
        ).one()
        kinds = session.scalars(
            select(JobEvent.kind).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        ).all()
    return {
        "results": results,
        "job": tuple(job),
        "chunks": chunk_rows(settings, job_id),
        "events": kinds,
    }


def db_now(settings):
    with session_scope(settings) as session:
        return session.scalar(text("SELECT clock_timestamp()"))


def test_job_survives_losing_a_host(can_make_hosts, settings, migrated, account_factory, tmp_path):
    account, _ = account_factory("trial")
    targets = [f"{urlsplit(u).hostname}:{urlsplit(u).port}"
               for u in (settings.database_url, settings.redis_url)]  # fmt: skip
    started = time.monotonic()
    with netns.hosts(2) as hosts:
        workers: dict[str, Proc] = {}
        on: dict[str, netns.Host] = {}
        # A stall file per host (LANEWAY_HOME of its own), so the one host's chunk can be
        # let go while the other's stays held.
        stalls: dict[str, Path] = {}
        procs: list[Proc] = []
        try:
            for host in hosts:
                node = f"cpu@{host.hostname}"
                fwd, ports = host_forwarder(host, targets, tmp_path)
                home = tmp_path / host.hostname
                home.mkdir()
                stalls[node] = stall_file(settings.replace(home=home))
                env = {
                    **ENV,
                    "LANEWAY_FAULTS": "stall",
                    "LANEWAY_HOME": str(home),
                    "LANEWAY_DATABASE_URL": via(settings.database_url, host.gateway, ports),
                    "LANEWAY_REDIS_URL": via(settings.redis_url, host.gateway, ports),
                }
                argv = host.argv([str(BIN / "laneway"), "worker", "cpu", "--name", "cpu"])
                workers[node] = Proc(host.hostname, argv, tmp_path, env)
                on[node] = host
                procs.append(fwd)
            procs += workers.values()
            for node, proc in workers.items():
                wait_for(worker_ready(proc, node), 120, f"worker {node}", procs)
            procs.append(beat(tmp_path, env=ENV))
            ready = time.monotonic()

            for path in stalls.values():
                path.touch()
            job_id = submit_job(account, stall_items(ITEMS, STALLED), settings=settings).id
            submitted = time.monotonic()
            held_seq = STALLED // int(settings.chunk_size)
            report = lambda: job_report(settings, job_id)  # noqa: E731

            def mid_job():
                """One host holds the held chunk, the other has finished a chunk of its own,
                and most of the job is still to do (fewer than half of the chunks done, some
                still queued)."""
                chunks = chunk_rows(settings, job_id)
                state, holder, *_ = chunks.get(held_seq, (None, None))
                states = [s for s, *_ in chunks.values()]
                ran = {worker for s, worker, *_ in chunks.values() if s == "done"}
                mid = "queued" in states and 2 * states.count("done") < len(states)
                held = state == "running" and ran >= set(workers) - {holder}
                return chunks if held and mid else None

            before = wait_for(mid_job, 60, "the held chunk, mid-job", procs, report=report)
            victim = before[held_seq][1]
            on[victim].cut()
            cut_at, cut_db = time.monotonic(), db_now(settings)
            (survivor,) = set(workers) - {victim}
            stalls[survivor].unlink()  # the survivor runs the held chunk; the victim stays held
            procs.remove(workers[victim])  # it cannot reach anything: it no longer counts
            # The victim holds one chunk (prefetch 1) and can take no other: the chunks open
            # now are the survivor's to run, the held one once the reconciler sends it again.
            open_at_cut = {seq for seq, (state, *_) in chunk_rows(settings, job_id).items()
                           if state != "done"}  # fmt: skip
            status = wait_final(settings, job_id, 90, procs)
            recovered = time.monotonic() - cut_at
            after = written(settings, job_id)

            # The cut host comes back and its chunk is let go: its worker finishes the chunk
            # and tries to write it, long after the survivor did.
            on[victim].restore()
            restored_at = time.monotonic()
            stalls[victim].unlink()
            procs.append(workers[victim])
            late = app.AsyncResult(before[held_seq][2])  # the message the victim still holds

            def late_attempt():
                state = late.state
                return state if state in ("SUCCESS", "FAILURE") else None

            late_state = wait_for(
                late_attempt, 60, "the cut host's late attempt at its chunk to end", procs,
                report=lambda: f"task {late.id}: {late.state}\n{report()}",
            )  # fmt: skip
            late_in = time.monotonic() - restored_at
            late_result = late.result

            def acknowledged():
                broker = snapshot(redis_client(settings), QUEUES)
                return late.id not in broker.delivered and late.id not in broker.waiting

            wait_for(acknowledged, 60, "the cut host's message to be acknowledged", procs,
                     report=lambda: f"task {late.id} still delivered")  # fmt: skip
            acked_in = time.monotonic() - restored_at
            final = written(settings, job_id)
        finally:
            for path in stalls.values():
                path.unlink(missing_ok=True)
            for proc in workers.values():
                if proc.alive():  # no warm shutdown for a host that is cut off
                    os.killpg(proc.proc.pid, signal.SIGKILL)
                proc.stop()
            for proc in procs:
                proc.stop()

    # Mid-job: the victim held a chunk, the survivor had finished at least one, and the job
    # had work queued.
    chunks = len(before)
    assert before[held_seq][:2] == ("running", victim), before
    assert survivor in {worker for state, worker, *_ in before.values() if state == "done"}
    done_at_cut = sum(state == "done" for state, *_ in before.values())
    assert 2 * done_at_cut < chunks and "queued" in [s for s, *_ in before.values()], before
    rest = open_at_cut - {held_seq}
    assert held_seq in open_at_cut and rest, open_at_cut

    assert status == "succeeded", job_report(settings, job_id)
    assert_exactly_one_result_each(settings, job_id, ITEMS)
    assert len(events(settings, job_id, "finalized")) == 1
    resent = events(settings, job_id, "chunk_redispatched")
    held_id = _chunk_id(settings, job_id, held_seq)
    assert [e["chunk"] for e in resent] == [held_id], resent
    assert resent[0]["reason"] == "its worker stopped beating"
    # The survivor ran the victim's chunk and every chunk still open at the cut.
    end = after["chunks"]
    assert {seq: end[seq][:2] for seq in open_at_cut} == dict.fromkeys(
        open_at_cut, ("done", survivor)
    ), end
    assert end[held_seq][3] == 2, "the held chunk was started twice: victim, then survivor"

    # The late attempt ran to its end, found the chunk finished, and wrote nothing: not a
    # result row (each keeps its version), not the chunks, not the job, no event.
    assert late_state == "SUCCESS", late_result
    assert late_result == {"chunk": held_id, "skipped": True}, late_result
    assert "stall over" in workers[victim].log.read_text()
    rewritten = sorted(i for i, v in final["results"].items() if after["results"].get(i) != v)
    assert rewritten == [] and len(final["results"]) == ITEMS, rewritten
    assert final == after
    assert_exactly_one_result_each(settings, job_id, ITEMS)

    with session_scope(settings) as session:
        resent_at = session.scalar(
            select(JobEvent.created_at).where(
                JobEvent.job_id == job_id, JobEvent.kind == "chunk_redispatched"
            )
        )
    print(
        f"FIGURES multi-host: hosts=2 items={ITEMS} chunks={chunks} "
        f"workers_ready={ready - started:.1f}s cut_after={cut_at - submitted:.1f}s "
        f"done_at_cut={done_at_cut}/{chunks} open_at_cut={len(open_at_cut)} "
        f"resent_after={(resent_at - cut_db).total_seconds():.1f}s "
        f"recovered_in={recovered:.1f}s late_attempt_in={late_in:.1f}s "
        f"late_acked_in={acked_in:.1f}s total={time.monotonic() - started:.1f}s"
    )


def _chunk_id(settings, job_id, seq: int) -> int:
    with session_scope(settings) as session:
        return session.scalar(select(Chunk.id).where(Chunk.job_id == job_id, Chunk.seq == seq))
