"""The maintainer's scripts in bench/ as they run: calibrate.py's command line and a real
stage, and the naive baseline's task (bench/naive.py), which the benchmark's worker includes
and a production worker's app never registers. Each starts a Python process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test starts a Python process

ROOT = Path(__file__).resolve().parents[2]
CALIBRATE = ROOT / "bench" / "calibrate.py"
NAIVE = "laneway.naive_item"


def calibrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CALIBRATE), *args], capture_output=True, text=True, timeout=300
    )


def test_an_unknown_stage_or_no_rounds_is_refused_by_name() -> None:
    done = calibrate("precision", "half_rows")
    assert done.returncode == 2 and "unknown stage half_rows" in done.stderr
    done = calibrate("--rounds", "0", "half-rows")
    assert done.returncode == 2 and "at least 1, not 0" in done.stderr


def test_a_stage_runs_and_reports_what_it_derived() -> None:
    # half-rows times bare products (no model to load): the quickest real stage.
    done = calibrate("half-rows", "--rounds", "2", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    if "HALF_ROWS" not in report["derived"]:
        pytest.skip(f"no fp16-weight products on this CPU: {report['half-rows']}")
    assert len(report["half-rows"]) == 8  # one line per row count
    assert int(report["derived"]["HALF_ROWS"]) in (0, 16, 64, 128, 256, 512, 768, 1024, 2048)
    assert any(line.startswith("HALF_ROWS=") for line in report["advice"])


def test_a_production_worker_does_not_load_the_naive_task():
    # In a fresh interpreter: importing bench.naive here would register it on every app.
    probe = (
        "from tasks.app import TASK_MODULES, app\n"
        "app.loader.import_default_modules()\n"
        "print(sorted(TASK_MODULES)); print('laneway.run_chunk' in app.tasks, "
        f"{NAIVE!r} in app.tasks)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    modules, registered = done.stdout.splitlines()[-2:]
    assert "naive" not in modules
    assert registered == "True False"  # the real tasks are there; the naive one is not


def test_throughput_without_fp32_is_refused_before_any_work(tmp_path):
    """A reduced precision is the baseline only once checked against fp32: without fp32 the
    run failed after the whole fleet run, on an empty list. Refused now before any work: a
    database that cannot be reached is never asked."""
    argv = [sys.executable, str(ROOT / "bench" / "throughput.py"), "--precisions", "bf16"]
    unreachable = {**os.environ, "LANEWAY_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env=unreachable)  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    # By name on any CPU: where this CPU offers bf16, fp32 is missing; elsewhere, bf16 is.
    assert "add fp32" in done.stderr or "does not offer ['bf16']" in done.stderr, done.stderr


def load_throughput():
    spec = importlib.util.spec_from_file_location("bench_throughput", ROOT / "bench/throughput.py")
    throughput = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(throughput)
    return throughput


@pytest.mark.parametrize("variant", ["fp32", "bf16", "bf16-pure"])
def test_every_bare_variant_embeds(variant):
    """Each bare-model variant the benchmark offers runs the pipeline (on a CPU without
    native bf16 the bf16 ones are slow, but they run): bf16-pure, the fp32 encoder's model
    turned to bf16, crashed in its warm-up where the packed forward built for fp32 met
    bf16 LayerNorm weights."""
    bare = load_throughput().Bare(
        1, [], [8], ["a short text", "another one, longer"], "embed", variant
    )
    bare.run(["one more text"])
    assert bare.items == 1 and bare.rate > 0


def test_the_benchmarks_worker_includes_the_naive_task(monkeypatch, tmp_path):
    from core.config.settings import Settings

    # The benchmark sets these for its run (a temporary LANEWAY_HOME when none is set):
    # here they name this test's folder, and are undone after it.
    monkeypatch.setenv("HF_HUB_OFFLINE", "kept")
    monkeypatch.setenv("LANEWAY_HOME", str(tmp_path))
    throughput = load_throughput()
    argv = throughput.bench_worker_argv(Settings.from_env({}), "bench-x")
    assert argv[argv.index("--include") + 1] == "bench.naive"
    assert "-Q" in argv and argv[argv.index("-Q") + 1] == "cpu,maintenance"
    # The module it names imports from the worker's directory (the checkout) and registers
    # the task there.
    probe = "import bench.naive as n; print(n.naive_item.name)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [NAIVE]


@pytest.mark.e2e  # a fleet on each broker: the web app and real workers
def test_the_control_plane_benchmark_measures_both_brokers_and_requests_on_a_real_fleet(
    tmp_path,
):
    """Its one-broker form (the environment's broker) runs in `laneway calibrate`'s test
    (tests/e2e/test_calibrate_plan.py)."""
    from tests.e2e.procs import free_port
    from tests.rabbit import RABBITMQ, rabbitmqctl

    rabbitmqctl("status")  # skips where no local node can make the benchmark's vhost
    out = tmp_path / "cp.json"
    argv = [sys.executable, str(ROOT / "bench" / "controlplane.py"), "--items", "100",
            "--tasks", "embed", "--warmup", "20", "--clients", "2", "--seconds", "1",
            "--load", "python,wrk", "--workers", "2", "--brokers",
            "redis,rabbitmq", "--port", str(free_port()), "--json", str(out)]  # fmt: skip
    env = {**os.environ, "LANEWAY_BENCH_RABBITMQ": RABBITMQ}
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["format"] == 2 and list(report["brokers"]) == ["redis", "rabbitmq"]
    assert report["workers"] == 2  # two cpu workers on this host, as `laneway fleet` runs them
    # How fast the cores ran as the run started and ended: a loop's seconds, some fraction.
    assert 0 < report["speed_probe_start_s"] < 60 and 0 < report["speed_probe_end_s"] < 60
    tiers = {}
    for broker, run in report["brokers"].items():
        job = run["batch"]["embed"]
        # Every item has exactly one result, none an error, on each broker.
        assert (job["status"], job["results"], job["result_errors"]) == ("succeeded", 100, 0)
        assert job["items_per_s"] > 0 and job["chunk_size"] >= 1
        tiers[broker] = job["cpu_ms_per_1000_items"]
        assert tiers[broker]["cpu_workers"] > 0 and tiers[broker]["web"] > 0, broker
    # Redis serves both fleets (results, the interactive path); the RabbitMQ node's own
    # process is metered on its fleet alone.
    common = {"web", "cpu_workers", "postgres", "redis", "tokenization", "worker_outside_model"}
    assert common <= set(tiers["redis"]) and "rabbitmq" not in tiers["redis"]
    assert common | {"rabbitmq"} <= set(tiers["rabbitmq"])
    # The interactive levels ran once, on the first broker's fleet (Redis either way).
    level = report["interactive"]["2"]
    assert level["load"] == "python" and level["requests"] > 0 and level["errors"] == 0
    assert level["p50_ms"] <= level["p99_ms"]
    assert level["cpu_ms_per_request"]["interactive_worker"] > 0
    # The slowest requests' own stages, from their Server-Timing headers.
    assert 0 < level["tail_ms"]["view"] <= level["tail_ms"]["total"]
    # The same level again from wrk, its CPU the client's.
    level = report["interactive"]["wrk.2"]
    assert level["load"] == "wrk" and level["requests"] > 0 and level["errors"] == 0
    assert level["p50_ms"] <= level["p99_ms"]
    assert level["cpu_ms_per_request"]["interactive_worker"] > 0
    assert level["cpu_ms_per_request"]["client"] > 0
    # The output ends with the two brokers' figures, one after the other.
    summary = done.stdout[done.stdout.rindex("redis, batch lanes on redis") :]
    assert "rabbitmq, batch lanes on rabbitmq" in summary and "rabbitmq beam.smp" in summary


def test_the_fair_share_benchmark_measures_a_small_job_and_the_shares_on_a_real_fleet(tmp_path):
    from tests.e2e.procs import free_port

    out = tmp_path / "fs.json"
    argv = [sys.executable, str(ROOT / "bench" / "fairshare.py"), "--big", "4000",
            "--small", "40", "--share-items", "3000", "--share-seconds", "8",
            "--window-seconds", "4", "--alone-items", "200", "--huge", "3000",
            "--port", str(free_port()), "--json", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    small = report["small_wait"]
    # The small job ended while the big one still had work: it was not held behind it.
    assert small["small_status"] == "succeeded"
    assert small["big_items_done_meanwhile"] < 4000
    equal, weighted = report["shares_equal"], report["shares_weighted_3_1"]
    assert equal["windows"] and weighted["windows"]
    low, high = equal["first_share_range"]
    assert 0.2 <= low <= high <= 0.8, equal
    assert sum(w["items"][0] for w in weighted["windows"]) > sum(
        w["items"][1] for w in weighted["windows"]
    ), weighted
    assert report["alone"]["status"] == "succeeded"
    assert report["first_chunk"]["first_chunk_after_commit_seconds"] < 60


def test_the_wrk_load_sends_distinct_texts_with_the_key_and_counts_refusals_apart() -> None:
    """bench/controlplane.py's C load generator against a server of this test's that
    records every request and refuses every seventh: each request is a POST of one
    distinct text with the key, and wrk's figures count the refusals apart from the
    answers (a refusal is never a request served)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from bench.controlplane import wrk_level

    seen: list[tuple[str, str, str, str, bytes]] = []
    lock = threading.Lock()

    class Recorder(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # kept alive, as the fleet's web app keeps it

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                seen.append((self.command, self.path, self.headers["Authorization"],
                             self.headers["Content-Type"], body))  # fmt: skip
                refused = len(seen) % 7 == 0
            answer = b'{"results": []}'
            self.send_response(503 if refused else 200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        got, cpu = wrk_level(server.server_address[1], "lw_secret", clients=4, seconds=1)
    finally:
        server.shutdown()
        server.server_close()
    refused = len(seen) // 7
    assert got["requests"] >= 50 and cpu > 0
    # Every request wrk counted reached the server; at most one a connection was cut short
    # when the time ran out.
    assert len(seen) - 4 <= got["requests"] <= len(seen)
    assert refused - 4 <= got["status"] <= refused and got["socket"] == 0
    assert 0 < got["p50_us"] <= got["p99_us"]
    texts = []
    for method, path, auth, kind, body in seen:
        assert (method, path, auth, kind) == ("POST", "/v1/embed", "Bearer lw_secret",
                                              "application/json")  # fmt: skip
        (item,) = json.loads(body)["items"]
        texts.append(item["text"])
    assert len(set(texts)) == len(texts)
