"""SIGTERM to `laneway worker` alone (what `docker stop` and a pod's termination send to
PID 1) reaches its celery worker: the chunk it is running finishes and is acked, the
worker takes nothing more, and laneway exits with the worker's status. The child runs in
a session of its own, so a signal to laneway's whole process group reaches it once, passed
on by laneway (a terminal's Ctrl-C: the shutdown stays warm)."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
import redis
from sqlalchemy import select

from core.queueing.broker import snapshot
from core.util.faults import stall_file
from db.models import Chunk, Job
from db.session import session_scope
from tests.e2e.procs import start_web, wait_for
from tests.faults.harness import (
    HOLDS,
    assert_exactly_one_result_each,
    chunk_states,
    cpu_worker,
    job_report,
    submit_held,
    wait_running_chunk,
)

pytestmark = pytest.mark.e2e


def test_sigterm_to_laneway_stops_its_worker_warm(settings, migrated, account_factory, tmp_path):
    account, _ = account_factory("trial")
    stall = stall_file(settings)
    worker = cpu_worker(tmp_path, "worker", env=HOLDS)
    try:
        job_id = submit_held(settings, account, 32, held=20)  # two chunks of 16: the second held
        wait_for(lambda: chunk_states(settings, job_id) == ["done", "running"], 60,
                 "the second chunk to run (stalled)", [worker],
                 report=lambda: job_report(settings, job_id))  # fmt: skip
        wait_running_chunk(settings, job_id, [worker])

        celery = child_pid(worker.proc.pid)
        os.kill(worker.proc.pid, signal.SIGTERM)  # laneway alone, not its process group
        wait_for(lambda: "Warm shutdown" in worker.log.read_text(), 30,
                 "the celery worker to begin its warm shutdown", [worker])  # fmt: skip
        stall.unlink()  # the chunk it runs may now finish
        code = worker.proc.wait(60)
        wait_for(lambda: group_gone(celery), 30, "the celery worker and its pool to exit")
    finally:
        stall.unlink(missing_ok=True)
        worker.stop()
    assert code == 0, worker.tail()
    assert chunk_states(settings, job_id) == ["done", "done"], job_report(settings, job_id)
    assert_exactly_one_result_each(settings, job_id, 32)
    # Acked: none of the job's chunk messages is left delivered or queued; its last chunk
    # settled the job before the worker stopped.
    r = redis.Redis.from_url(settings.redis_url)
    held = snapshot(r, ["cpu", "maintenance"])
    with session_scope(settings) as session:
        task_ids = set(session.scalars(select(Chunk.task_id).where(Chunk.job_id == job_id)))
    assert not task_ids & (held.waiting | set(held.delivered))
    with session_scope(settings) as session:
        assert session.get(Job, job_id).status == "succeeded"


def child_pid(pid: int) -> int:
    """The one child `laneway` runs, the leader of its own session and process group."""
    (child,) = psutil.Process(pid).children()
    assert os.getpgid(child.pid) == child.pid != os.getpgid(pid)
    return child.pid


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_ctrl_c_to_laneway_worker_stops_it_warm_not_cold(settings, migrated, tmp_path):
    """Ctrl-C sends SIGINT to the terminal's whole process group. laneway's child lives in a
    session of its own (so that a group's SIGTERM reaches it once, not also forwarded):
    laneway passes SIGINT on, once. A second SIGINT would make the shutdown cold."""
    worker = cpu_worker(tmp_path, "worker-ctrl-c")
    try:
        celery = child_pid(worker.proc.pid)
        os.killpg(worker.proc.pid, signal.SIGINT)
        code = worker.proc.wait(60)
        wait_for(lambda: group_gone(celery), 30, "the celery worker and its pool to exit")
    finally:
        worker.stop()
    log = worker.log.read_text()
    # It exited of itself, not killed by a signal (laneway reports those as 128 + N); celery
    # ends a worker stopped by SIGINT with status 1 by its own design.
    assert code == 1, worker.tail()
    assert "Warm shutdown" in log and "Cold shutdown" not in log, worker.tail()


def test_sigterm_to_laneway_web_stops_gunicorn(tmp_path):
    web, _ = start_web(tmp_path)
    gunicorn = child_pid(web.proc.pid)
    os.kill(web.proc.pid, signal.SIGTERM)  # laneway alone
    try:
        code = web.proc.wait(30)
        wait_for(lambda: group_gone(gunicorn), 30, "gunicorn and its workers to exit")
    finally:
        web.stop()
    assert code == 0, web.tail()
    assert "Shutting down: Master" in web.log.read_text()
