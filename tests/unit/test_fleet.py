"""The fleet supervisor with real child processes (small Python programs, no services)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from fleet.supervisor import ALWAYS, ON_DEMAND, RESTARTS_ALLOWED, Fleet
from workers.cores import OPENMP_SPIN_COUNT
from workers.devices import cuda_available


def program(code: str) -> list[str]:
    return [sys.executable, "-c", code]


SLEEPER = program("import time; time.sleep(60)")
# Exits 0 on SIGTERM, as a Celery worker's warm shutdown does.
WARM = program(
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
    "print('ready', flush=True); time.sleep(60)"
)
QUITTER = program("raise SystemExit(3)")


def wait(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_a_child_that_must_always_run_is_restarted_then_given_up_on(tmp_path):
    fleet = Fleet(log_dir=tmp_path)
    fleet.add("sleeper", SLEEPER)
    fleet.add("quitter", QUITTER)
    fleet.start_always()
    try:
        first = fleet.children["sleeper"].proc.pid
        fleet.children["sleeper"].proc.kill()
        assert wait(lambda: fleet.children["sleeper"].proc.poll() is not None)
        fleet.step()
        assert fleet.children["sleeper"].running and fleet.children["sleeper"].proc.pid != first

        def gave_up():
            fleet.step()
            return fleet.dead()

        assert wait(gave_up)
        assert fleet.dead() == [("quitter", 3)]
        assert len(fleet.children["quitter"].exits) == RESTARTS_ALLOWED + 1
    finally:
        fleet.stop()
    assert not fleet.children["sleeper"].running


@pytest.mark.slow
def test_on_demand_children_start_only_while_work_waits(tmp_path):
    depth = [0]
    fleet = Fleet(log_dir=tmp_path, gpu_depth=lambda: depth[0])
    fleet.add("gpu0", WARM, policy=ON_DEMAND)
    fleet.add("gpu1", WARM, policy=ON_DEMAND)
    try:
        fleet.step()
        assert not any(c.running for c in fleet.children.values())
        depth[0] = 1
        fleet.step()  # one chunk waiting (or running): one worker, not one per device
        assert [c.running for c in fleet.children.values()] == [True, False]
        fleet.step()
        assert [c.running for c in fleet.children.values()] == [True, False]
        depth[0] = 3
        fleet.step()
        assert all(c.running for c in fleet.children.values())  # one per device at most
        # Stopped warm by beat (exit 0): not restarted while nothing waits, and not held
        # against it, however often it happens.
        log = tmp_path / "gpu0.log"
        for started in range(1, RESTARTS_ALLOWED + 3):
            depth[0] = 0
            gpu0 = fleet.children["gpu0"]
            assert wait(lambda n=started: log.read_text().count("ready") == n)
            gpu0.proc.terminate()
            assert gpu0.proc.wait(timeout=20) == 0
            fleet.step()
            assert not gpu0.running
            depth[0] = 2  # gpu1 runs one of the two: gpu0 is wanted again
            fleet.step()
            assert gpu0.running
        assert fleet.dead() == []
    finally:
        fleet.stop()


@pytest.mark.slow
def test_an_on_demand_child_that_keeps_crashing_is_given_up(tmp_path):
    fleet = Fleet(log_dir=tmp_path, gpu_depth=lambda: 1)
    fleet.add("gpu0", QUITTER, policy=ON_DEMAND)
    try:

        def gave_up():
            fleet.step()
            return fleet.dead()

        assert wait(gave_up)
        assert fleet.dead() == [("gpu0", 3)]
    finally:
        fleet.stop()


def test_a_policy_names_what_it_does():
    assert (ALWAYS, ON_DEMAND) == ("always", "on_demand")


@pytest.mark.slow
def test_until_stopped_restarts_a_crash_but_not_a_clean_exit(tmp_path):
    from fleet.supervisor import UNTIL_STOPPED

    fleet = Fleet(log_dir=tmp_path)
    fleet.add("gpu0", WARM, policy=UNTIL_STOPPED)
    fleet.start_always()
    try:
        log = tmp_path / "gpu0.log"
        assert wait(lambda: log.read_text().count("ready") == 1)
        fleet.children["gpu0"].proc.kill()  # a crash
        fleet.children["gpu0"].proc.wait()
        fleet.step()
        assert fleet.children["gpu0"].running
        assert wait(lambda: log.read_text().count("ready") == 2)
        fleet.children["gpu0"].proc.terminate()  # a warm shutdown: exit 0
        assert fleet.children["gpu0"].proc.wait(timeout=20) == 0
        fleet.step()
        assert not fleet.children["gpu0"].running and fleet.finished()
    finally:
        fleet.stop()


def test_the_fleet_runs_an_interactive_worker_beside_the_batch_workers():
    from core.config.settings import Settings
    from fleet.processes import worker_env, worker_fleet

    settings = Settings.from_env({"LANEWAY_GPU_FALLBACK": "cpu", "LANEWAY_GPU_DEVICES": "0"})
    fleet = worker_fleet(settings)
    child = fleet.children["worker-interactive"]
    assert child.policy == "always" and child.node.startswith("interactive@")
    argv = " ".join(child.argv)
    assert "-Q interactive.cpu" in argv and "-P threads" in argv
    assert " cpu," not in argv and "-Q cpu" not in argv  # it never takes batch chunks
    assert "-Q cpu,maintenance" in " ".join(fleet.children["worker-cpu"].argv)
    # Idle OpenMP threads spin briefly (libgomp), then sleep, on a shared CPU.
    for env in (worker_env("cpu", settings), child.env):
        assert env["OMP_WAIT_POLICY"] == "PASSIVE"
        assert env["GOMP_SPINCOUNT"] == OPENMP_SPIN_COUNT


def test_an_interactive_worker_for_each_lane_the_gpu_one_pinned_to_its_device():
    from core.config.settings import Settings
    from fleet.processes import worker_fleet

    settings = Settings.from_env(
        {
            "LANEWAY_GPU_FALLBACK": "cpu",
            "LANEWAY_GPU_DEVICES": "2,3",
            "LANEWAY_INTERACTIVE_LANES": "cpu,gpu",
        }
    )
    fleet = worker_fleet(settings)
    gpu = fleet.children["worker-interactive-gpu2"]
    cpu = fleet.children["worker-interactive"]
    assert gpu.policy == cpu.policy == "always"  # a first request never waits for a start
    assert gpu.node.startswith("interactive-gpu2@")
    argv = " ".join(gpu.argv)
    assert "-Q interactive.gpu " in argv and "-P threads" in argv
    # Pinned before torch is imported: the first gpu device, as gpu workers are.
    assert gpu.env["CUDA_VISIBLE_DEVICES"] == "2" and "CUDA_VISIBLE_DEVICES" not in cpu.env
    # The batch gpu workers stay on demand, one per device.
    assert {n for n, c in fleet.children.items() if c.policy == "on_demand"} == {
        "worker-gpu2",
        "worker-gpu3",
    }


def test_without_cuda_the_fleet_runs_the_cpu_interactive_worker_alone():
    from core.config.settings import Settings
    from fleet.processes import interactive_lanes, worker_fleet

    # CPU fallback: a second interactive worker would only compete with the first.
    settings = Settings.from_env({"LANEWAY_GPU_FALLBACK": "cpu"})
    assert interactive_lanes(settings) == ("cpu",)
    assert not [n for n in worker_fleet(settings).children if n.startswith("worker-interactive-")]


@pytest.mark.slow
def test_a_device_held_by_another_process_gets_no_second_worker(tmp_path):
    """The lock a killed fleet's worker still holds keeps a new fleet's worker for that
    device from starting; it starts in the step after the device is free."""
    from fleet import devicelock

    lock = tmp_path / "locks" / "gpu-0.lock"
    held = devicelock.take(lock)  # an orphan from an earlier fleet, say
    assert held is not None
    devicelock.record_holder(held, 4242)
    fleet = Fleet(log_dir=tmp_path)
    fleet.add("gpu0", WARM, policy=ALWAYS, lock=lock)
    try:
        fleet.start_always()
        fleet.step()
        assert fleet.children["gpu0"].blocked and not fleet.children["gpu0"].running
        assert not fleet.finished()  # waiting for the device, not done
        os.close(held)
        fleet.step()
        child = fleet.children["gpu0"]
        assert child.running and not child.blocked
        # The worker holds the lock now (the fleet closed its own copy): nobody else gets it.
        assert devicelock.take(lock) is None
        assert devicelock.holder(lock) == str(child.proc.pid)
    finally:
        fleet.stop()
    again = devicelock.take(lock)  # the worker's exit freed the device
    assert again is not None
    os.close(again)


def test_a_device_lock_taken_twice_in_one_process_is_refused(tmp_path):
    from fleet import devicelock

    lock = devicelock.lock_path(tmp_path, "3")
    assert lock.name.endswith("-3.lock") and lock.parent == tmp_path / "locks"
    first = devicelock.take(lock)
    assert first is not None
    try:
        assert devicelock.take(lock) is None  # a second open file: flock says no
    finally:
        os.close(first)
    assert devicelock.holder(tmp_path / "missing.lock") == "?"


def test_an_operators_own_openmp_wait_policy_wins(monkeypatch):
    from core.config.settings import Settings
    from fleet.processes import worker_env

    settings = Settings.from_env({})
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    env = worker_env("cpu", settings)
    assert env["OMP_WAIT_POLICY"] == "ACTIVE" and "GOMP_SPINCOUNT" not in env
    monkeypatch.setenv("OMP_WAIT_POLICY", "")
    assert worker_env("cpu", settings)["GOMP_SPINCOUNT"] == OPENMP_SPIN_COUNT
    # A spin count of the operator's own, alone or beside a policy, goes through as set.
    monkeypatch.setenv("GOMP_SPINCOUNT", "0")
    env = worker_env("cpu", settings)
    assert env["GOMP_SPINCOUNT"] == "0" and "OMP_WAIT_POLICY" not in env
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    env = worker_env("cpu", settings)
    assert (env["OMP_WAIT_POLICY"], env["GOMP_SPINCOUNT"]) == ("PASSIVE", "0")


def _report_and_withdrawal(settings, fleet) -> tuple[dict, bytes | None]:
    """What `fleet` reports of its gpu devices in a step, and what is left once it stops;
    the host's report is put back as it was, since every later test's routing reads it."""
    import json
    import socket

    import redis

    from jobs.lanes import FLEET_KEY

    r = redis.Redis.from_url(settings.redis_url)
    key = FLEET_KEY.format(host=socket.gethostname())
    before = r.get(key)
    try:
        fleet.on_step(fleet)
        report = json.loads(r.get(key))
        fleet.stop()  # no child runs here: nothing to stop but the report
        return report, r.get(key)
    finally:
        r.set(key, before) if before is not None else r.delete(key)


@pytest.mark.skipif(cuda_available(), reason="this machine has CUDA: its devices are real")
def test_without_cuda_routing_is_told_of_no_gpu_and_large_jobs_stay_on_cpu(settings):
    """The demo's case: a gpu worker stands in on CPU (fallback), but routing must not
    count it as a device, or a large job waits for its cold start while cpu workers idle."""
    from fleet.processes import one_machine_settings, worker_fleet
    from jobs.planner import LiveLanes, Prices, route

    fallback = one_machine_settings(settings.replace(gpu_fallback="cpu"))
    fleet = worker_fleet(fallback)
    assert "worker-gpu0" in fleet.children  # the stand-in still serves the gpu queue
    report, withdrawn = _report_and_withdrawal(settings, fleet)
    assert report == {"gpu_devices": 0}
    assert withdrawn is None  # a fleet that stops takes its report back
    live = LiveLanes(cpu_workers=1, gpu_workers_up=0, gpu_devices=report["gpu_devices"])
    chosen = route("standard", 1200, gpu_threshold=500, deadline=3600, stats=None,
                   live=live, prices=Prices.of(settings))  # fmt: skip
    assert chosen.lane == "cpu" and "no gpu device" in chosen.reason


def test_devices_an_operator_names_are_reported_without_cuda(settings):
    """LANEWAY_GPU_DEVICES names devices the operator vouches for (a test lane of CPU
    stand-ins, or CUDA hidden from this process): routing is told of each of them."""
    from fleet.processes import one_machine_settings, worker_fleet

    named = one_machine_settings(settings.replace(gpu_fallback="cpu", gpu_devices=("0", "1")))
    report, withdrawn = _report_and_withdrawal(settings, worker_fleet(named))
    assert report == {"gpu_devices": 2} and withdrawn is None


def test_the_fleets_cpu_workers_share_the_hosts_cores_unless_the_operator_chose():
    from core.config.settings import Settings
    from fleet.processes import cpu_worker_env, worker_fleet

    def threads(fleet, name):
        return fleet.children[name].env.get("LANEWAY_TORCH_THREADS")

    cores = Settings.from_env({}).torch_threads  # the default: every core of this host
    one = worker_fleet(Settings.from_env({"LANEWAY_CPU_WORKERS": "1"}))
    assert threads(one, "worker-cpu") is None  # one worker: every core
    three = worker_fleet(Settings.from_env({"LANEWAY_CPU_WORKERS": "3"}))
    share = str(max(1, cores // 3))
    assert [threads(three, f"worker-{n}") for n in ("cpu", "cpu2", "cpu3")] == [share] * 3
    assert threads(three, "worker-interactive") is None  # it takes its cores from the batch side
    # More workers than cores: one thread each, never none.
    many = Settings.from_env({"LANEWAY_CPU_WORKERS": str(cores + 5)})
    assert cpu_worker_env(many, many.cpu_workers)["LANEWAY_TORCH_THREADS"] == "1"
    # The operator's own thread count stands, whatever the count of workers.
    chosen = Settings.from_env({"LANEWAY_CPU_WORKERS": "2", "LANEWAY_TORCH_THREADS": "5"})
    assert "LANEWAY_TORCH_THREADS" not in cpu_worker_env(chosen, 2)
    assert threads(worker_fleet(chosen), "worker-cpu2") is None
