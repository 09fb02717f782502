"""`laneway plan` (fleet/cli/plan.py): the table, --json, and every bad target or profile
as one line with exit status 1. The arithmetic itself is tests/unit/test_capacity.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleet.calibration import batch_figures, interactive_figures, write_profile
from fleet.capacity import PROFILE_VERSION, profile_from_dict
from fleet.cli import cli
from tests.unit.test_capacity import PROFILE


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    write_profile(PROFILE, path)
    return path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["plan", *args])
    return result.exit_code, result.output


def test_the_table_names_every_tier_and_the_cost(profile_path: Path) -> None:
    code, out = run("--profile", str(profile_path), "--batch", "cpu:classify=500_000",
                    "--interactive", "1000", "--p99-ms", "500")  # fmt: skip
    assert code == 0, out
    for needle in ("cpu worker", "interactive worker", "web", "Postgres:", "Redis:",
                   "an item", "a request", "Test CPU"):  # fmt: skip
        assert needle in out


def test_json_is_the_plan(profile_path: Path) -> None:
    code, out = run("--profile", str(profile_path), "--batch", "cpu:classify=360000", "--json")
    assert code == 0, out
    plan = json.loads(out)
    assert plan["processes"][0] == {"process": "cpu worker", "count": 1, "cores_each": 2,
                                    "gpus": 0, "busy_cores": 0.5}  # fmt: skip
    # the pool each process holds is db/session.py's, the one the processes use
    from db.session import MAX_OVERFLOW, POOL_SIZE

    assert plan["postgres"]["connections_max"] == 2 * (POOL_SIZE + MAX_OVERFLOW)


def test_repeated_loads_on_one_lane_and_task_add_up(profile_path: Path) -> None:
    """Two uploads' nightly loads named one after the other are one load of both: the
    plan sizes for 3,600,000 items an hour, not for the last one named."""

    def plan(*loads: str) -> dict:
        args = [a for load in loads for a in ("--batch", load)]
        code, out = run("--profile", str(profile_path), *args, "--json")
        assert code == 0, out
        return json.loads(out)

    both = plan("cpu:classify=1_200_000", "cpu:classify=2_400_000")
    assert both == plan("cpu:classify=3_600_000")
    assert both != plan("cpu:classify=2_400_000")


def test_an_impossible_p99_is_said_not_hidden(profile_path: Path) -> None:
    code, out = run("--profile", str(profile_path), "--interactive", "10", "--p99-ms", "10")
    assert code == 0
    assert "infeasible" in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--batch", "cpu:classify=-1"], "positive number of items per hour"),
        (["--batch", "cpu:classify=0"], "positive number of items per hour"),
        (["--batch", "cpu:classify=lots"], "is not a number"),
        (["--batch", "classify=5"], "LANE:TASK=ITEMS_PER_HOUR"),
        (["--batch", "tpu:classify=5"], "unknown lane 'tpu'"),
        (["--batch", "cpu:translate=5"], "unknown task 'translate'"),
        (["--batch", "cpu:classify=5", "--device", "tpu"], "unknown device 'tpu'"),
        (["--batch", "gpu:classify=5", "--device", "cuda"], "no GPU figure"),
        (["--batch", "cpu:classify=10", "--batch", "cpu:classify=-3"], "positive number of"),
        (["--batch", "cpu:classify=nan"], "positive number of items per hour"),
        (["--batch", "cpu:classify=1e400"], "positive number of items per hour"),
        (["--interactive", "-3"], "positive number of requests/s"),
        (["--interactive", "3", "--p99-ms", "0"], "p99"),
        (["--batch", "cpu:classify=5", "--model", "other"], "not 'other'"),
        ([], "nothing to plan"),
    ],
)
def test_bad_targets_exit_1_with_one_line(profile_path: Path, args: list, says: str) -> None:
    code, out = run("--profile", str(profile_path), *args)
    assert code == 1
    assert out.startswith("Error: ") and says in out
    assert out.count("\n") == 1


def test_a_missing_or_foreign_profile_exits_1(tmp_path: Path) -> None:
    code, out = run("--profile", str(tmp_path / "none.json"), "--batch", "cpu:classify=5")
    assert code == 1 and "run `laneway calibrate` first" in out and out.count("\n") == 1
    old = tmp_path / "old.json"
    write_profile({**PROFILE, "version": PROFILE_VERSION + 1}, old)
    code, out = run("--profile", str(old), "--batch", "cpu:classify=5")
    assert code == 1 and f"version {PROFILE_VERSION + 1}" in out and out.count("\n") == 1
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    code, out = run("--profile", str(broken), "--batch", "cpu:classify=5")
    assert code == 1 and "cannot read the profile" in out


def test_the_default_profile_lives_under_laneway_home(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LANEWAY_HOME", str(tmp_path))
    from core.config.settings import get_settings

    get_settings.cache_clear()
    try:
        code, out = run("--batch", "cpu:classify=5")
        assert code == 1 and str(tmp_path / "capacity-profile.json") in out
    finally:
        get_settings.cache_clear()


def test_benchmark_reports_become_profile_figures() -> None:
    # bench/throughput.py's report over 1,000 items on 2 threads, bf16 at 400 items/s
    throughput = {"items": 1000, "threads": 2, "bare": {"fp32": {"items_per_s": 160.0},
                  "bf16": {"items_per_s": 400.0}},
                  "fleets": [{"items_per_s": 380.0, "outside_model_seconds": 0.5,
                              "stage_seconds": {"pre": 0.2, "model": 3.0, "post": 0.1}},
                             {"items_per_s": 410.0, "outside_model_seconds": -9.0, "workers": 2,
                              "stage_seconds": {"model": 4.0},
                              "settings": {"LANEWAY_TORCH_THREADS": "1"}}]}  # fmt: skip
    tiers = {"worker": 6.0, "bench": 9.0, "postgres": 0.5, "redis": 0.1}
    cost, measured = batch_figures(throughput, tiers, {"bytes": 2e6, "rows": 2000}, "bf16")
    # The model as the fleet's workers paid it: 2 threads x 3.0 s over 1,000 items, and
    # at one thread (the two-worker fleet's chunks' model stages, 4.0 s in all).
    assert cost.model_cpu_s == pytest.approx(0.006)
    assert cost.model_at(2) == pytest.approx(0.006) and cost.model_at(1) == pytest.approx(0.004)
    assert cost.model_at(8) == pytest.approx(0.006)  # not measured: the profile's own
    assert cost.worker_cpu_s == pytest.approx(0.001)
    assert cost.postgres_cpu_s == pytest.approx(0.0005)
    assert cost.postgres_bytes == 2000 and cost.postgres_rows == 2
    # the costs are the one worker's; each fleet is a check, with its workers' threads
    assert measured == [
        {"workers": 1, "threads": 2, "items_per_s": 380.0},
        {"workers": 2, "threads": 1, "items_per_s": 410.0},
    ]
    # A report without stage seconds (an older bench): the bare model's 2 threads / 400 items/s.
    for run in throughput["fleets"]:
        del run["stage_seconds"]
    bare, _ = batch_figures(throughput, tiers, {"bytes": 2e6, "rows": 2000}, "bf16")
    assert bare.model_cpu_s == pytest.approx(0.005) and bare.model_cpu_s_at == {}

    def level(clients: int, batch: float, worker: float, p50: float, p99: float, rps: float):
        cpu = {"web": 1.5, "interactive worker": worker, "redis (shared)": 0.3, "bench client": 1}
        return {"clients": clients, "p50_ms": p50, "p99_ms": p99, "requests_per_s": rps,
                "cpu_ms_per_request": cpu, "stage_median_ms": {"batch": batch}}  # fmt: skip

    latency = {"idle": {"messages": [level(64, 21, 5.0, 280, 460, 250),
                                     level(1, 1, 11, 12.9, 20, 78)]}}  # fmt: skip
    inter, levels = interactive_figures(latency, 2)
    assert inter.per_request("worker", 1) == pytest.approx(0.011)
    assert inter.per_request("worker", 21) == pytest.approx(0.005)
    assert inter.batch_at(64) == pytest.approx(21)
    assert (inter.p50_ms_alone, inter.p99_ms_alone) == (12.9, 20)
    # each level's p99 over its mean latency (clients / requests/s): 20 ms over 1/78 s,
    # 460 ms over 64/250 s
    tails = [x["p99_over_mean"] for x in sorted(inter.levels, key=lambda x: x["clients"])]
    assert tails == [pytest.approx(20 * 78 / 1000), pytest.approx(460 * 250 / 64000)]
    assert inter.busy_share == pytest.approx((1.5 + 5 + 0.3 + 1) * 250 / 1000 / 2)
    assert [x["clients"] for x in levels] == [1, 64]
    whole = {**PROFILE, "batch": {"classify": cost.__dict__},
             "interactive": {"classify": inter.__dict__}}  # fmt: skip
    assert profile_from_dict(whole).batch["classify"] == cost


def test_the_window_is_the_job_not_the_worker_start() -> None:
    from fleet.calibration import window

    # a worker loads its model (10 CPU s), idles, runs a 4 s job (8 CPU s), and ends;
    # the bare model runs afterwards in the bench process alone
    series = [
        (0.0, {"worker": 0.0, "bench": 0.0}, True),
        (5.0, {"worker": 10.0, "bench": 0.0}, True),
        (6.0, {"worker": 10.0, "bench": 0.5}, True),
        (10.0, {"worker": 18.0, "bench": 1.0}, True),
        (20.0, {"worker": 18.0, "bench": 30.0}, False),
    ]
    assert window(series, 4.0) == {"worker": 8.0, "bench": 0.5}
    assert window([(0.0, {"worker": 1.0}, False)], 4.0) == {}


def test_each_fleets_window_is_its_own_job() -> None:
    """bench/throughput.py --workers 1,2 runs two fleets one after the other: the costs
    come from the first fleet's job, not the last one's."""
    from fleet.calibration import window

    series = [
        (0.0, {"worker": 0.0}, True),
        (10.0, {"worker": 18.0}, True),  # the first fleet's 4 s job ends here
        (12.0, {"worker": 18.0}, False),  # its workers stopped
        (14.0, {"worker": 30.0}, True),  # the second fleet's two workers load and run
        (20.0, {"worker": 50.0}, True),
    ]
    assert window(series, 9.0) == {"worker": 18.0}  # from the sample nearest 1.0: 0.0
    assert window(series, 6.0, fleet=1) == {"worker": 20.0}
    assert window(series, 4.0, fleet=2) == {}


def test_control_plane_figures_replace_the_tiers_they_measure() -> None:
    from fleet.calibration import controlplane_figures
    from fleet.capacity import PlanError

    # bench/controlplane.py's --json: CPU ms per 1,000 items by tier for each task's job,
    # under the one broker calibration runs it on
    per_thousand = {
        "web": 900.0, "cpu_workers": 2500.0, "worker_outside_model": 2100.0,
        "postgres": 400.0, "redis": 150.0, "client": 30.0, "tokenization": 800.0,
    }  # fmt: skip
    job = {"classify": {"cpu_ms_per_1000_items": per_thousand}}
    report = {"format": 2, "brokers": {"redis": {"batch": job}}}
    assert controlplane_figures(report, "classify") == pytest.approx(
        {
            "web_cpu_s": 0.0009,
            "worker_cpu_s": 0.0021,
            "postgres_cpu_s": 0.0004,
            "redis_cpu_s": 0.00015,
        }  # fmt: skip
    )
    # A report of another shape is refused by name, not misread.
    with pytest.raises(PlanError, match="format 1, not 2"):
        controlplane_figures({"format": 1, "batch": job}, "classify")


def calibrate(monkeypatch, tmp_path: Path, *args: str, unset: tuple[str, ...] = (), **env: str):
    """`laneway calibrate` with these settings read afresh, LANEWAY_HOME in the test's folder:
    each case here is refused before any benchmark starts (one would start processes, which
    a unit test may not: tests/spawnguard.py fails it)."""
    from core.config.settings import get_settings

    monkeypatch.setenv("LANEWAY_HOME", str(tmp_path / "home"))
    for name in unset:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli, ["calibrate", *args])
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    assert "Traceback" not in result.output and "batch: bench/" not in result.output
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("levels", "says"),
    [("0,x", "whole numbers"), ("1,eight", "whole numbers"), ("1.5", "whole numbers"),
     (",", "at least one"), ("", "at least one"), ("0", "from 1 to 1024"),
     ("-4,8", "from 1 to 1024"), ("1,100000", "from 1 to 1024")],
)  # fmt: skip
def test_bad_client_levels_are_refused_before_any_benchmark(
    monkeypatch, tmp_path: Path, levels: str, says: str
) -> None:
    """The interactive benchmark runs last, minutes in: a typo in --levels is caught first."""
    code, out = calibrate(monkeypatch, tmp_path, "--levels", levels)
    assert code == 2 and "Invalid value for '--levels'" in out and says in out


def test_client_levels_are_given_to_the_benchmark_rising_and_once_each() -> None:
    from fleet.cli.plan import _levels

    assert _levels(None, None, "64, 8,1,8") == "1,8,64"
    assert _levels(None, None, " 4 ") == "4"


@pytest.mark.parametrize(
    ("unset", "env"),
    [(("LANEWAY_REDIS_URL", "LANEWAY_DATABASE_URL"), {}),  # the embedded default
     (("LANEWAY_REDIS_URL",), {}),  # Postgres, the embedded Redis
     ((), {"LANEWAY_DATABASE_URL": "sqlite:///{home}/x.db"})],  # SQLite, a real Redis
)  # fmt: skip
def test_the_embedded_default_is_refused_by_name(monkeypatch, tmp_path: Path, unset, env) -> None:
    """A new user straight from `make demo`: the profile would price SQLite and an embedded
    Redis, which no fleet runs on; calibrate says what to set instead, and writes nothing."""
    env = {k: v.format(home=tmp_path) for k, v in env.items()}
    code, out = calibrate(monkeypatch, tmp_path, unset=unset, **env)
    assert code == 1 and out.count("\n") == 1
    assert "LANEWAY_DATABASE_URL" in out and "LANEWAY_REDIS_URL" in out
    assert not (tmp_path / "home" / "capacity-profile.json").exists()
    assert not (tmp_path / "home" / "redis.sock").exists()  # no embedded Redis started


def test_a_profile_path_that_cannot_be_written_is_refused_before_the_benchmarks(
    monkeypatch, tmp_path: Path
) -> None:
    folder = tmp_path / "profiles"
    folder.mkdir()
    code, out = calibrate(monkeypatch, tmp_path, "--profile", str(folder))
    assert code == 1 and "is a folder" in out
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    code, out = calibrate(monkeypatch, tmp_path, "--profile", str(a_file / "sub" / "p.json"))
    assert code == 1 and f"cannot make {a_file / 'sub'}" in out
    assert a_file.read_text() == "x"


def test_redis_cpu_is_read_over_a_unix_socket_too(tmp_path: Path) -> None:
    """kombu's redis+socket:// spelling (a valid LANEWAY_REDIS_URL) is redis-py's unix://:
    the reader connects to the socket (none here: a connection error, not a bad URL)."""
    import redis

    from fleet.calibration import redis_cpu_reader

    read = redis_cpu_reader(f"redis+socket://{tmp_path}/redis.sock")
    assert read is not None
    with pytest.raises(redis.ConnectionError, match="redis.sock"):
        read()


@pytest.mark.slow  # a Python child: the benchmark's stand-in
def test_a_benchmark_is_never_left_running_when_calibration_stops_early(tmp_path: Path) -> None:
    """The sampler fails at its start (Redis unreachable: its first reading) once the
    benchmark is running; the benchmark is interrupted, not left behind (it used to run on,
    and the fleets it starts with it)."""
    import uuid

    import psutil
    import redis

    from fleet.calibration import run_bench
    from tests.e2e.procs import free_port

    token = uuid.uuid4().hex
    stand_in = ["-c", "import time, sys; time.sleep(600)", token]
    with pytest.raises(redis.ConnectionError):
        run_bench(stand_in, f"redis://127.0.0.1:{free_port()}/0", tmp_path / "r.json", 60)

    def alive() -> list:
        return [p for p in psutil.process_iter(["cmdline"]) if token in (p.info["cmdline"] or [])]

    assert alive() == []


@pytest.fixture
def sigint_ignored():
    """This process with SIGINT ignored, as a shell starts a background job (`laneway
    calibrate &` in a script): the disposition a child inherits across exec."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.slow  # a Python child: the benchmark's stand-in
@pytest.mark.usefixtures("sigint_ignored")
def test_a_benchmark_takes_the_sigint_that_stops_it_even_when_calibration_ignores_sigint(
    tmp_path: Path,
) -> None:
    """The stand-in reports its own SIGINT handler: Python's, which turns the stop's SIGINT
    into KeyboardInterrupt, not the ignored one it would inherit from here (it would then
    run on, with its fleets, until killed after the grace)."""
    from fleet.calibration import run_bench

    out = tmp_path / "r.json"
    stand_in = ["-c", "import json, signal, sys; json.dump({'handler': str(signal.getsignal("
                "signal.SIGINT))}, open(sys.argv[1], 'w'))", str(out)]  # fmt: skip
    report, _ = run_bench(stand_in, "", out, 60)
    assert "default_int_handler" in report["handler"], report


def test_sigterm_stops_calibration_as_ctrl_c_does_and_the_handler_is_put_back() -> None:
    """`laneway calibrate` under a `kill`: KeyboardInterrupt, on which the running benchmark
    is stopped with its fleets (run_bench's stop); afterwards SIGTERM is handled as before."""
    import os
    import signal

    from fleet.calibration import stop_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    restore = stop_on_sigterm()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) is before
