"""SIGKILL to a `laneway` wrapper (worker, web, beat, flower, fleet, up) leaves none of its
processes behind (fleet/lifeline.py), and a fleet restarted after one was killed runs one
gpu worker per device, never two (fleet/devicelock.py)."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable

import httpx
import psutil
import pytest

from tests.e2e.procs import BIN, Proc, free_port, http, wait_for

pytestmark = pytest.mark.e2e

# A fleet that loads little: no cpu worker, the interactive one, a gpu0 worker on demand
# (on CPU, as on every machine without CUDA).
FLEET_ENV = {
    "LANEWAY_CPU_WORKERS": "0",
    "LANEWAY_GPU_FALLBACK": "cpu",
    "LANEWAY_GPU_DEVICES": "0",
    "LANEWAY_INTERACTIVE_LANES": "cpu",
}
# The kernel kills them at once; generous for a loaded 2-core machine all the same.
GONE_WITHIN = 60


def answers(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return http.get(url, timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    return check


def pings(node: str) -> Callable[[], bool]:
    from tasks import app

    full = f"{node}@{socket.gethostname()}"
    return lambda: any(full in r for r in app.control.ping(destination=[full], timeout=0.5))


def wrapper(kind: str, tmp_path) -> tuple[list[str], dict[str, str], Callable[[], bool] | None]:
    """argv, environment, and what says the wrapper's children are up."""
    laneway = str(BIN / "laneway")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if kind == "worker":
        # A prefork pool of two: the celery parent's own children must go too.
        argv = [laneway, "worker", "maintenance", "-c", "2", "--name", "killed-worker"]
        return argv, {}, pings("killed-worker")
    if kind == "web":
        return [laneway, "web", "--port", str(port)], {}, answers(f"{url}/healthz")
    if kind == "beat":
        return [laneway, "beat"], {}, None
    if kind == "flower":
        return [laneway, "flower", "--port", str(port)], {}, answers(f"{url}/healthcheck")
    if kind == "fleet":
        return [laneway, "fleet"], FLEET_ENV, pings("interactive")
    assert kind == "up"
    return [laneway, "up", "--port", str(port)], FLEET_ENV, answers(f"{url}/healthz")


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def kill_left(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.mark.parametrize("kind", ["worker", "web", "beat", "flower", "fleet", "up"])
def test_sigkill_to_a_wrapper_leaves_no_child_behind(kind, tmp_path):
    argv, env, ready = wrapper(kind, tmp_path)
    proc = Proc(f"wrapper-{kind}", argv, tmp_path, env)
    children: list[psutil.Process] = []
    try:
        if ready is not None:
            wait_for(ready, 120, f"laneway {kind}'s children to be up", [proc])
        wait_for(lambda: descendants(proc.proc.pid), 60, f"laneway {kind}'s child", [proc])
        children = descendants(proc.proc.pid)
        os.kill(proc.proc.pid, signal.SIGKILL)  # the wrapper alone: no handler runs
        proc.proc.wait(10)
        _, alive = psutil.wait_procs(children, timeout=GONE_WITHIN)
        assert not alive, f"left running after SIGKILL to laneway {kind}: {alive}\n{proc.tail()}"
    finally:
        kill_left(children)
        proc.stop()


def gpu_workers(fleet_pid: int) -> list[psutil.Process]:
    """The gpu0 celery workers a fleet started (its direct children, not their pools)."""
    try:
        kids = psutil.Process(fleet_pid).children()
    except psutil.NoSuchProcess:
        return []
    found = []
    for kid in kids:
        try:
            if any(a.startswith("gpu0@") for a in kid.cmdline()):
                found.append(kid)
        except psutil.NoSuchProcess:
            pass
    return found


def living(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ask_for_gpu_work() -> None:
    """A message on the gpu lane: the fleet's scale-up starts gpu0 for it."""
    from tasks.scaling import device_health

    device_health.apply_async(queue="gpu")


def forget_the_gpu_lane(settings) -> None:
    """What the killed fleet leaves in this run's broker and database: gpu-lane messages
    (waiting, or delivered to the killed gpu0 and never acknowledged, which count as gpu work)
    and its gpu0's worker row, never marked stopped. Later tests expect a gpu lane at zero."""
    import json

    from sqlalchemy import update

    from core.queueing.broker import UNACKED, UNACKED_INDEX, queue_keys
    from core.store.redis_conn import redis_client
    from db.common import utcnow
    from db.models import Worker
    from db.session import session_scope

    r = redis_client(settings)
    r.delete(*queue_keys("gpu"))
    for tag, raw in r.hgetall(UNACKED).items():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, list) and len(entry) == 3 and entry[2] == "gpu":
            r.hdel(UNACKED, tag)
            r.zrem(UNACKED_INDEX, tag)
    with session_scope(settings) as session:
        session.execute(
            update(Worker)
            .where(Worker.hostname.like("gpu%"), Worker.stopped_at.is_(None))
            .values(stopped_at=utcnow(), stop_reason="killed by test_die_together")
        )


def test_a_fleet_restarted_after_sigkill_runs_one_gpu_worker_per_device(tmp_path, settings):
    first = Proc("fleet-1", [str(BIN / "laneway"), "fleet"], tmp_path, FLEET_ENV)
    second = None
    leftovers: list[psutil.Process] = []
    try:
        ask_for_gpu_work()
        old = wait_for(lambda: gpu_workers(first.proc.pid), 120, "the first gpu0", [first])
        wait_for(pings("gpu0"), 120, "the first gpu0 to answer", [first])
        leftovers = descendants(first.proc.pid)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)

        second = Proc("fleet-2", [str(BIN / "laneway"), "fleet"], tmp_path, FLEET_ENV)
        ask_for_gpu_work()
        overlaps = []

        def new_gpu0_up() -> list[psutil.Process] | None:
            new = gpu_workers(second.proc.pid)
            old_alive = any(living(p) for p in old)
            if new and old_alive:
                overlaps.append((old, new))
            return new if new and not old_alive else None

        new = wait_for(new_gpu0_up, 180, "the restarted fleet's gpu0", [second])
        wait_for(pings("gpu0"), 120, "the new gpu0 to answer", [second])
        assert not overlaps, f"two gpu0 workers at once: {overlaps}"
        assert len(new) == 1 and len(gpu_workers(second.proc.pid)) == 1
        _, alive = psutil.wait_procs(leftovers, timeout=GONE_WITHIN)
        assert not alive, f"the killed fleet left {alive}"
    finally:
        kill_left(leftovers)
        if second is not None:
            second.stop()
        first.stop()
        forget_the_gpu_lane(settings)
