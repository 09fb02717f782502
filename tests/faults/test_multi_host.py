"""One job over workers on two hosts, and one host cut off mid-job.

Each host is a network namespace joined to this machine by a veth pair (tests/faults/
netns.py), with its own hostname; its worker is the real `laneway worker cpu`, reaching
Redis and Postgres on this machine through a TCP forwarder on the host side of its pair
(tests/faults/forward.py). The job's chunks spread over both hosts; one host's link goes
down while it holds a chunk (LANEWAY_FAULTS=stall holds it); beat's reconciler, here on
this machine, sees that host's worker stop beating and sends its chunk again, and the
other host runs it: the job completes with every item's result exactly once."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import select

from db.models import Chunk
from db.session import session_scope
from laneway.faults import stall_file
from laneway.jobs import submit_job
from tests.e2e.procs import BIN, Proc, wait_for, worker_ready
from tests.faults import netns
from tests.faults.harness import (
    FAST,
    assert_exactly_one_result_each,
    beat,
    events,
    job_report,
    stall_items,
    wait_final,
)

pytestmark = pytest.mark.e2e

WHY_NOT = netns.unavailable()
FORWARD = Path(__file__).with_name("forward.py")
# Dead after 3 missed heartbeats + 5 s: 11 s at 2 s (the default 5 s gives 20 s).
ENV = {**FAST, "LANEWAY_WORKER_HEARTBEAT": "2"}
ITEMS, STALLED = 96, 40  # six chunks of 16; the third is held on whichever host takes it


def via(url: str, host: str, ports: dict[str, int]) -> str:
    """`url` with its host:port replaced by the forwarder's address for it."""
    parts = urlsplit(url)
    target = f"{parts.hostname}:{parts.port}"
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@" if auth else ""
    return urlunsplit(parts._replace(netloc=f"{netloc}{host}:{ports[target]}"))


def forwarder(host: netns.Host, targets: list[str], logdir) -> tuple[Proc, dict[str, int]]:
    argv = [sys.executable, str(FORWARD), "--listen", host.gateway, *targets]
    proc = Proc(f"forward-{host.hostname}", argv, logdir)

    def ports():
        for line in proc.log.read_text().splitlines():
            if line.startswith("FORWARD "):
                return json.loads(line.removeprefix("FORWARD "))
        return None

    return proc, wait_for(ports, 20, f"the forwarder for {host.hostname}", [proc])


def chunk_workers(settings, job_id) -> dict[int, tuple[str, str | None]]:
    with session_scope(settings) as session:
        rows = session.execute(
            select(Chunk.seq, Chunk.state, Chunk.worker).where(Chunk.job_id == job_id)
        ).all()
    return {r.seq: (r.state, r.worker) for r in rows}


@pytest.mark.skipif(WHY_NOT is not None, reason=f"multi-host test: {WHY_NOT}")
def test_job_survives_losing_a_host(settings, migrated, account_factory, tmp_path):
    account, _ = account_factory("trial")
    targets = [f"{urlsplit(u).hostname}:{urlsplit(u).port}"
               for u in (settings.database_url, settings.redis_url)]  # fmt: skip
    stall = stall_file(settings)
    started = time.monotonic()
    with netns.hosts(2) as hosts:
        workers: dict[str, Proc] = {}
        procs: list[Proc] = []
        try:
            for host in hosts:
                fwd, ports = forwarder(host, targets, tmp_path)
                env = {
                    **ENV,
                    "LANEWAY_FAULTS": "stall",
                    "LANEWAY_DATABASE_URL": via(settings.database_url, host.gateway, ports),
                    "LANEWAY_REDIS_URL": via(settings.redis_url, host.gateway, ports),
                }
                argv = host.argv([str(BIN / "laneway"), "worker", "cpu", "--name", "cpu"])
                workers[f"cpu@{host.hostname}"] = Proc(host.hostname, argv, tmp_path, env)
                procs.append(fwd)
            procs += workers.values()
            for node, proc in workers.items():
                wait_for(worker_ready(proc, node), 120, f"worker {node}", procs)
            procs.append(beat(tmp_path, env=ENV))
            ready = time.monotonic()

            stall.touch()
            job_id = submit_job(account, stall_items(ITEMS, STALLED), settings=settings).id
            held_seq = STALLED // int(settings.chunk_size)

            def held_and_rest_done():
                chunks = chunk_workers(settings, job_id)
                state, node = chunks.get(held_seq, (None, None))
                others = [s for seq, (s, _) in chunks.items() if seq != held_seq]
                return node if state == "running" and set(others) == {"done"} else None

            victim = wait_for(held_and_rest_done, 60, "the held chunk, the rest done", procs,
                              report=lambda: job_report(settings, job_id))  # fmt: skip
            spread = {node for _, node in chunk_workers(settings, job_id).values()}
            (survivor,) = set(workers) - {victim}
            cut_host = next(h for h in hosts if victim == f"cpu@{h.hostname}")
            cut_host.cut()
            cut_at = time.monotonic()
            stall.unlink()  # the other host may run the chunk; the cut one cannot report
            procs.remove(workers[victim])  # it cannot reach anything: it no longer counts
            status = wait_final(settings, job_id, 90, procs)
            recovered = time.monotonic() - cut_at
        finally:
            stall.unlink(missing_ok=True)
            for proc in workers.values():
                if proc.alive():  # no warm shutdown for a host that is cut off
                    os.killpg(proc.proc.pid, signal.SIGKILL)
                proc.stop()
            for proc in procs:
                proc.stop()

    assert spread == set(workers), f"both hosts ran chunks before the cut: {spread}"
    assert status == "succeeded", job_report(settings, job_id)
    assert_exactly_one_result_each(settings, job_id, ITEMS)
    assert len(events(settings, job_id, "finalized")) == 1
    resent = events(settings, job_id, "chunk_redispatched")
    held_id = _chunk_id(settings, job_id, held_seq)
    assert [e["chunk"] for e in resent] == [held_id], resent
    assert resent[0]["reason"] == "its worker stopped beating"
    assert chunk_workers(settings, job_id)[held_seq] == ("done", survivor)
    print(
        f"FIGURES multi-host: hosts=2 items={ITEMS} workers_ready={ready - started:.1f}s "
        f"recovered_in={recovered:.1f}s total={time.monotonic() - started:.1f}s"
    )


def _chunk_id(settings, job_id, seq: int) -> int:
    with session_scope(settings) as session:
        return session.scalar(select(Chunk.id).where(Chunk.job_id == job_id, Chunk.seq == seq))
