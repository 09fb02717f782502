"""The gpu lane's bookkeeping against the real Postgres and Redis (no workers): idle gpu
workers found for scale-down, lanes measured from finished chunks, devices reported by
fleets, and the routing each job records."""

from __future__ import annotations

import pytest
import redis

from db.common import utcnow
from db.models import Chunk, Job
from db.session import session_scope
from jobs.lanes import (
    FLEET_KEY,
    MIN_MEASURED_ITEMS,
    alive_workers,
    fleet_gpu_devices,
    lane_totals,
    publish_fleet,
    read_lane_stats,
    stats_from,
    store_lane_stats,
)
from tasks.scaling import idle_gpu_workers
from tests.factories import add_worker, stored_job


def test_only_live_gpu_workers_idle_past_the_timeout_are_scale_down_candidates(settings, migrated):
    idle = add_worker(settings, ["gpu"], idle_for=120)
    busy = add_worker(settings, ["gpu"], idle_for=120, running=1)
    recent = add_worker(settings, ["gpu"], idle_for=10)
    cpu = add_worker(settings, ["cpu", "maintenance"], idle_for=120)
    dead = add_worker(settings, ["gpu"], idle_for=120, seen_ago=settings.worker_dead_after + 5)
    found = {
        w.id: seconds for w, seconds in idle_gpu_workers(settings.replace(gpu_idle_timeout=60))
    }
    assert idle in found and found[idle] >= 120
    assert not {busy, recent, cpu, dead} & set(found)


def test_beat_stops_no_gpu_worker_when_something_else_does(settings, migrated, monkeypatch):
    import tasks.scaling

    idle = add_worker(settings, ["gpu"], idle_for=120)
    hostname = next(w.hostname for w in alive_workers(settings) if w.id == idle)
    asked = []
    # Asked whether it holds anything, the worker says it does: nothing is shut down.
    monkeypatch.setattr(tasks.scaling, "_holds_nothing", lambda _app, h: asked.append(h))
    beat = settings.replace(gpu_idle_timeout=60)
    assert tasks.scaling.scale_down(beat) == [] and hostname in asked
    asked.clear()
    assert tasks.scaling.scale_down(beat.replace(gpu_scale_down="external")) == []
    assert asked == []


def base_core_seconds(totals, lane):
    return totals.get(lane, {}).get("core_seconds", 0.0)


def test_lanes_are_measured_from_finished_chunks(settings, migrated):
    before = lane_totals(settings)
    cpu_job, cpu_chunks = stored_job(settings, ["x"] * 600, chunk_size=300)
    gpu_job, gpu_chunks = stored_job(settings, ["y"] * 600, lane="gpu", chunk_size=300)
    with session_scope(settings) as session:
        for chunk_id in cpu_chunks:
            chunk = session.get(Chunk, chunk_id)
            chunk.state, chunk.finished_at, chunk.device = "done", utcnow(), "cpu"
            chunk.pre_seconds, chunk.model_seconds, chunk.post_seconds = 0.1, 2.0, 0.05
            chunk.cpu_cores = 2  # a worker of two torch threads
        for chunk_id in gpu_chunks:
            chunk = session.get(Chunk, chunk_id)
            chunk.state, chunk.finished_at, chunk.device = "done", utcnow(), "cuda"
            chunk.pre_seconds, chunk.model_seconds, chunk.post_seconds = 0.1, 0.15, 0.05
    after = lane_totals(settings)
    for lane, seconds in (("cpu", (0.2, 4.0, 0.1)), ("gpu", (0.2, 0.3, 0.1))):
        base = before.get(lane, {"items": 0, "pre": 0.0, "model": 0.0, "post": 0.0})
        assert after[lane]["items"] - base["items"] == 600
        for stage, added in zip(("pre", "model", "post"), seconds, strict=True):
            assert after[lane][stage] - base[stage] == pytest.approx(added)
    assert after["gpu"]["device"] == "cuda"
    # Priced per core: the cpu chunks' seconds twice, the gpu ones' (none recorded) once.
    assert after["cpu"]["core_seconds"] - base_core_seconds(before, "cpu") == pytest.approx(4.3 * 2)
    assert after["gpu"]["core_seconds"] - base_core_seconds(before, "gpu") == pytest.approx(0.6)

    mine = {
        "cpu": {"items": 600, "pre": 0.2, "model": 4.0, "post": 0.1, "device": "cpu"},
        "gpu": {"items": 600, "pre": 0.2, "model": 0.3, "post": 0.1, "device": "cuda"},
    }
    stats = stats_from(mine, [12.0, 18.0])
    assert stats.cpu_items_per_second == pytest.approx(600 / 4.3, abs=1e-3)
    assert stats.cpu_cores == 1.0  # no cores recorded: one, as such chunks were priced
    two = stats_from({**mine, "cpu": {**mine["cpu"], "core_seconds": 4.3 * 2}}, [])
    assert two.cpu_cores == pytest.approx(2)
    assert two.cpu_items_per_second == stats.cpu_items_per_second  # speed per worker as before
    assert stats.gpu_items_per_second == pytest.approx(2000)
    assert stats.gpu_cpu_seconds_per_item == pytest.approx(0.3 / 600)
    assert (stats.gpu_device, stats.cold_start_seconds) == ("cuda", 15.0)
    few = {**mine, "gpu": {**mine["gpu"], "items": MIN_MEASURED_ITEMS - 1}}
    assert stats_from(few, []) is None  # not enough gpu items to tell yet


def test_fleets_report_their_devices_and_routing_reads_them(settings, migrated):
    r = redis.Redis.from_url(settings.redis_url)

    def forget() -> None:
        for key in r.scan_iter(FLEET_KEY.format(host="*")):
            r.delete(key)

    forget()
    assert fleet_gpu_devices(settings) is None  # nobody says
    publish_fleet(r, "host-a", 2)
    publish_fleet(r, "host-b", 1)
    assert fleet_gpu_devices(settings) == 3
    assert fleet_gpu_devices(settings.replace(gpu_devices=("0",))) == 1  # the setting wins
    forget()


def test_each_job_records_how_its_lane_was_chosen(settings, migrated, account_factory):
    from jobs.submit import submit_job

    account, _ = account_factory("enterprise")
    settings = settings.replace(routing="measured")
    store_lane_stats(None, settings)
    threshold = submit_job(account, [(str(i), f"t{i}") for i in range(50)], settings=settings)
    mine = {
        "cpu": {"items": 600, "pre": 0.2, "model": 4.0, "post": 0.1, "device": "cpu"},
        "gpu": {"items": 600, "pre": 0.2, "model": 0.3, "post": 0.1, "device": "cuda"},
    }
    store_lane_stats(stats_from(mine, [15.0]), settings)
    assert read_lane_stats(settings).gpu_items_per_second == pytest.approx(2000)
    try:
        measured = submit_job(account, [(str(i), f"t{i}") for i in range(50)], settings=settings)
        pinned = submit_job(
            account,
            [(str(i), f"t{i}") for i in range(50)],
            settings=settings.replace(routing="threshold"),
        )
    finally:
        store_lane_stats(None, settings)
    with session_scope(settings) as session:
        first = session.get(Job, threshold.id).routing
        second = session.get(Job, measured.id).routing
    assert first["policy"] == "threshold" and first["lane"] == "gpu"
    assert "LANEWAY_GPU_THRESHOLD=40" in first["reason"]
    assert second["policy"] == "measured"
    assert set(second["estimates"]) == {"cpu", "gpu"}
    assert second["inputs"]["stats"]["gpu_items_per_second"] == pytest.approx(2000)
    assert second["lane"] == measured.lane
    # LANEWAY_ROUTING=threshold: the threshold decides, whatever was measured.
    assert pinned.routing["policy"] == "threshold" and pinned.lane == "gpu"
    assert pinned.routing["reason"].startswith("LANEWAY_ROUTING=threshold: 50 items > ")
