"""The gpu lane's elasticity with real processes, in CPU fallback mode (no GPU here): each
gpu worker pinned to its device, started from zero by `laneway fleet` when gpu work waits,
stopped by beat when idle (never while busy), and nothing lost across scale-downs."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select

from core.util.faults import stall_file
from db.models import Chunk, Job, Worker, WorkerEvent
from db.session import session_scope
from inference.precision import choose, runtime_label
from jobs.submit import submit_job
from tests.e2e.procs import BIN, Proc, wait_for
from tests.faults.harness import assert_exactly_one_result_each, stall_items, wait_final

pytestmark = pytest.mark.e2e
HOST = socket.gethostname()
FALLBACK = {"LANEWAY_GPU_FALLBACK": "cpu"}


def ping(nodes: list[str]) -> set[str]:
    from tasks import app

    replies = app.control.ping(destination=nodes, timeout=1.0)
    return {name for reply in replies for name in reply}


def celery_processes(root: psutil.Process, node: str) -> list[psutil.Process]:
    """The worker's main process and its pool children."""
    mains = [
        p
        for p in root.children(recursive=True)
        if "celery" in " ".join(p.cmdline()) and f"{node.split('@')[0]}@%h" in p.cmdline()
    ]
    return [proc for main in mains for proc in (main, *main.children(recursive=True))]


def test_each_gpu_worker_process_sees_exactly_its_device(settings, migrated, tmp_path):
    env = {**FALLBACK, "LANEWAY_GPU_DEVICES": "0,1"}
    workers = Proc("gpu-workers", [str(BIN / "laneway"), "worker", "gpu"], tmp_path, env)
    nodes = [f"gpu0@{HOST}", f"gpu1@{HOST}"]
    try:
        wait_for(lambda: ping(nodes) == set(nodes), 180, "both gpu workers", [workers])
        wait_for(
            lambda: workers.log.read_text().count("device check passed") == 2,
            60,
            "both device checks",
            [workers],
        )
        root = psutil.Process(workers.proc.pid)
        for device, node in enumerate(nodes):
            procs = celery_processes(root, node)
            assert len(procs) >= 2  # the worker and its one pool process
            assert {p.environ().get("CUDA_VISIBLE_DEVICES") for p in procs} == {str(device)}
            health = subprocess.run(
                [str(BIN / "laneway"), "health", node],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert health.returncode == 0, health.stderr
            report = json.loads(health.stdout)
            assert report["ok"] and report["cuda_visible_devices"] == str(device)
            assert report["device"] == "cpu"  # the fallback, pinned all the same
        with session_scope(settings) as session:
            rows = session.scalars(
                select(Worker).where(Worker.hostname.in_(nodes), Worker.stopped_at.is_(None))
            ).all()
            assert sorted((w.hostname, w.gpu_device) for w in rows) == list(
                zip(nodes, ("0", "1"), strict=True)
            )
    finally:
        workers.stop()
    # --device N starts that one worker only.
    one = Proc("gpu-one", [str(BIN / "laneway"), "worker", "gpu", "--device", "1"], tmp_path, env)
    try:
        wait_for(lambda: ping(nodes) == {nodes[1]}, 180, "the gpu1 worker alone", [one])
    finally:
        one.stop()


@pytest.fixture(scope="module")
def fleet_home(tmp_path_factory) -> Path:
    """The fleet's LANEWAY_HOME, where a test's stall file holds a chunk (core/util/faults)."""
    return tmp_path_factory.mktemp("gpu-fleet-home")


@pytest.fixture(scope="module")
def fleet(migrated, tmp_path_factory, fleet_home):
    """`laneway fleet` (a cpu worker kept up, gpu0 and gpu1 on demand) and beat stopping gpu
    workers idle for 3 s; a chunk with a stall-marked text is held in its model stage
    while the fleet's stall file exists."""
    logdir = tmp_path_factory.mktemp("gpu-fleet")
    env = {
        **FALLBACK,
        "LANEWAY_GPU_DEVICES": "0,1",
        "LANEWAY_GPU_IDLE_TIMEOUT": "3",
        "LANEWAY_CPU_WORKERS": "1",  # the gpu lane is under test: one cpu worker is enough
        "LANEWAY_RECONCILE_INTERVAL": "2",
        "LANEWAY_FAULTS": "stall",
        "LANEWAY_HOME": str(fleet_home),
    }
    supervisor = Proc("fleet", [str(BIN / "laneway"), "fleet"], logdir, env)
    scheduler = Proc("beat", [str(BIN / "laneway"), "beat"], logdir, env)
    try:
        wait_for(lambda: ping([f"cpu@{HOST}"]), 180, "the fleet's cpu worker", [supervisor])
        assert not ping([f"gpu0@{HOST}", f"gpu1@{HOST}"])  # the gpu lane starts at zero
        yield [supervisor, scheduler]
    finally:
        scheduler.stop()
        supervisor.stop(timeout=90)


def gpu_events(settings, since) -> list[WorkerEvent]:
    with session_scope(settings) as session:
        events = session.scalars(
            select(WorkerEvent)
            .where(WorkerEvent.hostname.like("gpu%"), WorkerEvent.created_at >= since)
            .order_by(WorkerEvent.id)
        ).all()
        session.expunge_all()
        return list(events)


def gpu_workers_report(settings) -> str:
    """The gpu workers as the database sees them (for a failure's message)."""
    with session_scope(settings) as session:
        rows = session.scalars(
            select(Worker).where(Worker.hostname.like("gpu%")).order_by(Worker.started_at)
        ).all()
        return "\n".join(
            f"{w.id} running={w.running_tasks} idle_since={w.idle_since} "
            f"seen={w.last_seen_at} stopped={w.stopped_at} ({w.stop_reason})"
            for w in rows
        )


def now_db(settings):
    from db.common import utcnow

    return utcnow()


def test_gpu_work_at_zero_starts_workers_and_beat_stops_the_idle_one_not_the_busy_one(
    settings, fleet, fleet_home, account_factory
):
    started = now_db(settings)
    account, _ = account_factory("enterprise")
    # Two chunks wait: one held in its model stage (a stall-marked text, while the stall
    # file exists) keeps one gpu worker busy as long as the test needs, a short one lets the
    # other go idle.
    stall = stall_file(settings.replace(home=fleet_home))
    stall.touch()
    job = submit_job(account, stall_items(60, 0, "z"), settings=settings.replace(chunk_size=60))
    short = submit_job(
        account,
        [(f"q{i}", f"late parcel {i}") for i in range(50)],
        settings=settings.replace(chunk_size=50),
    )
    assert job.lane == short.lane == "gpu" and job.routing["policy"] == "threshold"
    try:
        assert wait_final(settings, short.id, 240, fleet) == "succeeded"

        def idle_one_down():
            events = gpu_events(settings, started)
            return any(e.kind == "scale_down" for e in events)

        # The idle worker goes while the other still holds the chunk.
        wait_for(idle_one_down, 60, "the idle gpu worker scaled down", fleet,
                 report=lambda: gpu_workers_report(settings))  # fmt: skip
    finally:
        stall.unlink(missing_ok=True)
    assert wait_final(settings, job.id, 120, fleet) == "succeeded"
    assert_exactly_one_result_each(settings, job.id, 60)

    with session_scope(settings) as session:
        chunk = session.scalars(select(Chunk).where(Chunk.job_id == job.id)).one()
        busy_node, chunk_started, chunk_done = chunk.worker, chunk.started_at, chunk.finished_at
        # The model stage's hand-on to the post stage (queued for it): the busy gpu worker's
        # last moment of work on this chunk. started_at is the post stage's claim.
        model_done = chunk.queued_at
        # A gpu worker falling back to the CPU follows the CPU's precision rules.
        expected = choose("auto", chunk.device).precision
        assert (chunk.precision, chunk.runtime) == (expected, runtime_label(expected, chunk.device))
        scaled_up = session.scalars(
            select(Worker).where(Worker.hostname.like("gpu%"), Worker.started_at >= started)
        ).all()
        assert {w.hostname for w in scaled_up} == {f"gpu0@{HOST}", f"gpu1@{HOST}"}
        assert all(w.start_reason.startswith("gpu work waiting (depth") for w in scaled_up)
    # The busy worker's cold start: from work waiting to its first task done.
    measured = [w.cold_start_seconds for w in scaled_up if w.cold_start_seconds]
    assert measured and all(s > 0 for s in measured)
    print(f"FIGURES gpu-lane cold starts (cpu fallback): {sorted(measured)} s")
    idle_node = ({f"gpu0@{HOST}", f"gpu1@{HOST}"} - {busy_node}).pop()

    def scaled_down():
        downs = [e for e in gpu_events(settings, started) if e.kind == "scale_down"]
        return downs if {e.hostname for e in downs} >= {idle_node, busy_node} else None

    downs = wait_for(scaled_down, 60, "both gpu workers scaled down", fleet)
    idle_down = next(e for e in downs if e.hostname == idle_node)
    busy_down = next(e for e in downs if e.hostname == busy_node)
    # The idle one went while the other still ran the chunk; the busy one only once its
    # model stage had handed the chunk on (the cpu lane's post stage may still run then).
    assert idle_down.created_at < chunk_done
    assert busy_down.created_at > model_done and chunk_done > chunk_started >= model_done

    def stop_reasons():
        with session_scope(settings) as session:
            reasons = session.scalars(
                select(Worker.stop_reason).where(
                    Worker.hostname.like("gpu%"), Worker.started_at >= started
                )
            ).all()
        return set(reasons) if None not in reasons else None

    # Back at zero: every gpu worker started here stopped warm, none is left running.
    assert wait_for(stop_reasons, 90, "the gpu lane back at zero", fleet) == {"warm shutdown"}
    assert not ping([idle_node, busy_node])


def test_scale_downs_in_the_middle_of_a_stream_of_jobs_lose_nothing(
    settings, fleet, account_factory
):
    started = now_db(settings)
    account, _ = account_factory("enterprise")
    # Each job one chunk (48 items: past the gpu lane's threshold of 40), so that the lane's
    # depth, and the workers each scale-up starts, is one: the stream is about the lane
    # leaving zero and going back, which one worker shows. (Two at once, the idle one
    # stopped and the busy one kept, is the test above.)
    one_chunk = settings.replace(chunk_size=48)
    jobs = []
    for n in range(4):  # each way of arriving twice
        items = [(f"s{n}-{i}", f"the parcel {i} of order {n} is late") for i in range(48)]
        submitted = now_db(settings)
        jobs.append(submit_job(account, items, settings=one_chunk).id)
        assert wait_final(settings, jobs[-1], 240, fleet) == "succeeded"
        if n % 2 == 0:
            # The next job arrives the moment beat has told the lane's worker to stop: it
            # finds the worker in its warm shutdown, or the lane at zero. (The worker that
            # ran this job's model stage may be stopped before the cpu lane's post stage
            # has finished the job: look for any scale-down since the job was sent.)
            wait_for(
                lambda s=submitted: any(e.kind == "scale_down" for e in gpu_events(settings, s)),
                90,
                "a scale-down",
                fleet,
                report=lambda: gpu_workers_report(settings),
            )
        else:
            # ...or just as beat looks for idle workers (idle timeout 3 s, checked every s).
            time.sleep(3.5)
    for job_id in jobs:
        assert_exactly_one_result_each(settings, job_id, 48)

    def cycles():
        events = gpu_events(settings, started)
        downs = sum(e.kind == "scale_down" for e in events)
        ups = sum(e.kind == "start" for e in events)
        return (downs, ups) if downs >= 2 and ups >= 2 else None

    # Scaled down and up again more than once in the middle of the stream.
    wait_for(
        cycles,
        90,
        "two scale-downs and two scale-ups",
        fleet,
        report=lambda: gpu_workers_report(settings),
    )
    with session_scope(settings) as session:
        lanes = session.scalars(select(Job.lane).where(Job.id.in_(jobs))).all()
    assert set(lanes) == {"gpu"}
