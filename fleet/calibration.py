"""`laneway calibrate`: run the benchmarks on this machine and store what the capacity plan
needs (fleet/capacity.py) as a versioned profile.

The benchmarks are the repository's own scripts, each with its report written as JSON:
bench/throughput.py (the bare model and one cpu worker on a job), bench/latency.py (the web
app and an interactive worker at 1, 8 and 64 clients) and, where the checkout has it,
bench/controlplane.py (each tier's CPU per item around a near-free model). While a
benchmark runs, a sampler reads the CPU seconds of its processes (the bench itself and the
celery workers it starts), of the Postgres server's processes and of Redis (INFO cpu), so
each tier's cost per item is its CPU over the items, whichever machine runs it."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet.capacity import PROFILE_VERSION, BatchCost, InteractiveCost, PlanError

ROOT = Path(__file__).resolve().parent.parent
PROFILE_NAME = "capacity-profile.json"
SAMPLE_S = 0.2


def default_path(home: Path) -> Path:
    return home / PROFILE_NAME


def machine() -> dict[str, Any]:
    """What the profile was measured on: the CPU's model name (lscpu's), its cores, the
    memory, the device the model ran on."""
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count() or 1,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "device": "cpu",
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


# --- the sampler: each tier's CPU seconds while a benchmark runs -------------------------


class TierSampler:
    """Reads, every SAMPLE_S, the CPU seconds of the benchmark's processes (`celery` in the
    command line: the worker tier; the rest: the bench and its clients), of every process
    named postgres, and of Redis; a process that ends keeps its last reading."""

    def __init__(self, root_pid: int, redis_cpu: Callable[[], float] | None) -> None:
        import psutil

        self._psutil, self.root_pid, self.redis_cpu = psutil, root_pid, redis_cpu
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        # (time, each tier's CPU so far, whether a worker was alive) at every sample
        self.series: list[tuple[float, dict[str, float], bool]] = []
        self.redis_first = redis_cpu() if redis_cpu else 0.0
        self.redis_last = self.redis_first
        for proc in self._postgres():
            self.first[proc.pid] = self._cpu(proc)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _cpu(self, proc: Any) -> float:
        t = proc.cpu_times()
        return t.user + t.system

    def _postgres(self) -> list[Any]:
        return [p for p in self._psutil.process_iter(["name"]) if p.info["name"] == "postgres"]

    def sample(self) -> None:
        psutil = self._psutil
        try:
            root = psutil.Process(self.root_pid)
            mine = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            mine = []
        worker_alive = False
        for proc in mine:
            try:
                tier = "worker" if "celery" in " ".join(proc.cmdline()) else "bench"
                self.last[proc.pid] = (tier, self._cpu(proc))
                worker_alive = worker_alive or tier == "worker"
            except psutil.Error:
                pass
        for proc in self._postgres():
            try:
                self.last[proc.pid] = ("postgres", self._cpu(proc))
            except psutil.Error:
                pass
        if self.redis_cpu:
            try:
                self.redis_last = self.redis_cpu()
            except Exception:  # noqa: BLE001 - a reading missed is the last one kept
                pass
        self.series.append((time.monotonic(), self.totals(), worker_alive))

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def __enter__(self) -> TierSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def totals(self) -> dict[str, float]:
        out = {"worker": 0.0, "bench": 0.0, "postgres": 0.0}
        for pid, (tier, cpu) in self.last.items():
            out[tier] += cpu - self.first.get(pid, 0.0)
        out["redis"] = self.redis_last - self.redis_first
        return out

    def last_seconds_of_workers(self, seconds: float, fleet: int = 0) -> dict[str, float]:
        """Each tier's CPU over the last `seconds` the benchmark's workers of its `fleet`-th
        fleet lived: that job's run, which ends as the benchmark stops its workers, without
        the workers' start (the model's load and precision check), the bare model's runs
        or another fleet's."""
        return window(self.series, seconds, fleet)


def window(
    series: list[tuple[float, dict[str, float], bool]], seconds: float, fleet: int = 0
) -> dict:
    """The growth of each tier's CPU from `seconds` before the last sample at which a worker
    of the `fleet`-th fleet lived (the fleets one after the other: runs of samples with a
    worker alive) to that sample, reading the series at the sample nearest each end."""
    # Each fleet's last sample with a worker alive: the next one has none, or there is none.
    ends = [
        i
        for i, (_, _, worker) in enumerate(series)
        if worker and (i + 1 == len(series) or not series[i + 1][2])
    ]
    if len(ends) <= fleet:
        return {}
    end_t, end, _ = series[ends[fleet]]
    start = min(series, key=lambda x: abs(x[0] - (end_t - seconds)))[1]
    return {tier: end[tier] - start.get(tier, 0.0) for tier in end}


def redis_cpu_reader(url: str) -> Callable[[], float] | None:
    """Redis's own CPU seconds (INFO cpu), where LANEWAY_REDIS_URL names a server (over
    TCP, TLS or a unix socket, kombu's `redis+socket://` spelling included)."""
    if not url.startswith("redis"):
        return None
    import redis

    from core.store.redis_conn import client_url

    client = redis.Redis.from_url(client_url(url))

    def read() -> float:
        info = client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    return read


def run_bench(
    argv: list[str], redis_url: str, out: Path, timeout: float
) -> tuple[dict, TierSampler]:
    """Run one benchmark script (its report written to `out`) under the sampler: its
    report and the sampler, which holds each tier's CPU seconds."""
    log = out.with_suffix(".log")
    with open(log, "wb") as fh:
        # Its own session, so that a Ctrl-C at the terminal reaches this process alone,
        # which then interrupts the benchmark once, below.
        proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=fh, stderr=fh,
                                start_new_session=True, preexec_fn=interruptible)  # fmt: skip
        try:
            with TierSampler(proc.pid, redis_cpu_reader(redis_url)) as sampler:
                try:
                    code = proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    raise PlanError(f"{argv[0]} ran past {timeout:.0f} s; see {log}") from None
                sampler.sample()
        finally:
            if proc.poll() is None:
                stop_benchmark(proc)
    if code != 0 or not out.exists():
        raise PlanError(f"{argv[0]} failed (exit {code}); see {log}")
    return json.loads(out.read_text()), sampler


def interruptible() -> None:
    """In the benchmark's process before it starts: SIGINT's default, which Python turns
    into KeyboardInterrupt, whatever this process had. A shell without job control starts
    a background job (`laneway calibrate &` in a script) with SIGINT ignored, and an
    ignored signal stays ignored across exec: the benchmark would then ignore
    `stop_benchmark`'s SIGINT and be killed after the grace, leaving the fleets it started
    running."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_on_sigterm() -> Callable[[], None]:
    """SIGTERM (a `kill`, a container's stop) handled as Ctrl-C is, by KeyboardInterrupt,
    so that the running benchmark is stopped with its fleets rather than left behind (it
    runs in a session of its own, which a signal to this process does not reach). Call in
    the main thread; returns what puts the previous handler back."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, previous)


def stop_benchmark(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """End a benchmark that this run is leaving early (the sampler failed, the time limit,
    Ctrl-C), never leaving it running on its own: a SIGINT first, on which the benchmark
    stops the fleets it started (their processes are in sessions of their own, which
    killing the benchmark would not reach), then a kill after `grace` seconds."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- from the benchmarks' reports to the profile's figures (pure) ------------------------


def batch_figures(
    report: dict, tiers: dict[str, float], growth: dict[str, float], precision: str
) -> tuple[BatchCost, list[dict[str, Any]]]:
    """One task's batch costs from bench/throughput.py's report (`precision`: the bare
    model's variant the workers run), the tiers' CPU seconds over its first fleet's run
    (one worker), and what the database grew by; with each fleet's measured rate, its
    worker count and each worker's torch threads, for the checks."""
    items, threads = report["items"], report["threads"]
    bare = report["bare"].get(precision) or report["bare"]["fp32"]
    fleet = report["fleets"][0]

    def threads_of(run: dict) -> int:
        return int(env_of(run).get("LANEWAY_TORCH_THREADS", threads))

    def model_cpu_s(run: dict) -> float | None:
        """The run's model stage in core-seconds per item, as its workers paid it (their
        chunks' micro-batches); None when the report has no stage seconds."""
        seconds = (run.get("stage_seconds") or {}).get("model")
        return threads_of(run) * seconds / items if seconds else None

    # Each fleet's own model stage, by its workers' threads (the first fleet's count wins).
    model_at: dict[int, float] = {}
    for run in report["fleets"]:
        cost_s = model_cpu_s(run)
        if cost_s is not None:
            model_at.setdefault(threads_of(run), cost_s)
    cost = BatchCost(
        # a worker's cores are held for the model's time and for the job's time outside the
        # model stage (tokenizing, claims, upserts, hand-offs), whether busy or waiting; the
        # model's time as the fleet's workers spent it (the bare model, which batches the
        # whole sample by length, only where the report has no stage seconds)
        model_cpu_s=model_at.get(threads_of(fleet)) or threads / bare["items_per_s"],
        worker_cpu_s=max(0.0, threads * fleet["outside_model_seconds"] / items),
        web_cpu_s=0.0,  # the benchmark submits through the service layer, not the web app
        postgres_cpu_s=tiers["postgres"] / items,
        redis_cpu_s=tiers["redis"] / items,
        postgres_bytes=max(0.0, growth["bytes"] / items),
        postgres_rows=max(0.0, growth["rows"] / items),
        model_cpu_s_at=model_at,
    )
    measured = [
        {
            "workers": run.get("workers", 1),
            "threads": threads_of(run),
            "items_per_s": run["items_per_s"],
        }
        for run in report["fleets"]
    ]
    return cost, measured


def env_of(run: dict) -> dict[str, str]:
    """The settings a bench/throughput.py fleet ran with beside the defaults ("defaults":
    none)."""
    given = run.get("settings")
    return given if isinstance(given, dict) else {}


def interactive_figures(report: dict, cores: int) -> tuple[InteractiveCost, list[dict]]:
    """One task's interactive costs from bench/latency.py's idle levels: each tier's CPU
    per request at each level with the median batch its worker ran (Server-Timing) and
    its p99 over its mean latency (Little's law: clients over requests/s), the latency
    alone (one client), and the share of the cores busy at the most clients."""
    levels = sorted(next(iter(report["idle"].values())), key=lambda x: x["clients"])
    names = {"web": "web", "worker": "interactive worker", "redis": "redis (shared)",
             "client": "bench client"}  # fmt: skip
    rows = [
        {"clients": x["clients"], "batch": max(1.0, x["stage_median_ms"].get("batch", 1.0)),
         **{f"{tier}_cpu_s": x["cpu_ms_per_request"].get(name, 0.0) / 1000
            for tier, name in names.items()},
         **({"p99_over_mean": x["p99_ms"] * x["requests_per_s"] / (1000 * x["clients"])}
            if x["p99_ms"] > 0 and x["requests_per_s"] > 0 else {})}
        for x in levels
    ]  # fmt: skip
    top = levels[-1]
    busy = sum(top["cpu_ms_per_request"].values()) * top["requests_per_s"] / 1000
    cost = InteractiveCost(
        levels=tuple(rows),
        p50_ms_alone=levels[0]["p50_ms"],
        p99_ms_alone=levels[0]["p99_ms"],
        busy_share=min(1.0, busy / cores),
    )
    measured = [
        {"clients": x["clients"], "requests_per_s": x["requests_per_s"], "p99_ms": x["p99_ms"]}
        for x in levels
    ]
    return cost, measured


def controlplane_figures(report: dict, task: str) -> dict[str, float]:
    """Each tier's CPU per item of `task`'s batch job from bench/controlplane.py's --json
    report, where the checkout has that benchmark (the fleet around a near-free model, so
    that what surrounds the model is measured alone): web, the workers outside the model
    (tokenization is theirs), Postgres and Redis, as the BatchCost fields they replace.
    Its report (format 2) gives them per batch broker, as
    `brokers.<broker>.batch.<task>.cpu_ms_per_1000_items.<tier>`; calibration runs it on
    the broker the settings name, the report's only one."""
    if report.get("format") != 2:
        raise PlanError(f"bench/controlplane.py wrote format {report.get('format')}, not 2")
    (run,) = report["brokers"].values()
    per_thousand = run["batch"][task]["cpu_ms_per_1000_items"]

    def seconds(tier: str) -> float:
        return float(per_thousand.get(tier, 0.0)) / 1_000_000

    return {
        "web_cpu_s": seconds("web"),
        "worker_cpu_s": seconds("worker_outside_model"),
        "postgres_cpu_s": seconds("postgres"),
        "redis_cpu_s": seconds("redis"),
    }


# --- the run -----------------------------------------------------------------------------


def db_footprint(database_url: str) -> dict[str, float]:
    """The database's bytes on disk and its item and result rows (Postgres; zeros else)."""
    if not database_url.startswith("postgresql"):
        return {"bytes": 0.0, "rows": 0.0}
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            size = conn.execute(text("SELECT pg_database_size(current_database())")).scalar()
            rows = conn.execute(
                text("SELECT (SELECT count(*) FROM job_items) + (SELECT count(*) FROM results)")
            ).scalar()
    finally:
        engine.dispose()
    return {"bytes": float(size), "rows": float(rows)}


def calibrate(
    task: str,
    items: int,
    seconds: float,
    levels: str,
    database_url: str,
    redis_url: str,
    model: str,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the benchmarks on this machine and return the profile (a JSON-able dict)."""
    from inference.precision import choose

    bench = ROOT / "bench"
    if not (bench / "throughput.py").exists():
        raise PlanError(f"calibration runs the benchmarks in {bench}: use a checkout of Laneway")
    threads = os.cpu_count() or 1
    precision = choose("auto", "cpu").precision
    bare = "bf16" if precision == "bf16" else "fp32"
    work = Path(tempfile.mkdtemp(prefix="laneway-calibrate-"))
    say(f"batch: bench/throughput.py, {items} items of {task} (logs in {work})")
    before = db_footprint(database_url)
    out = work / "throughput.json"
    # One worker (the costs), then two on this host, each with half the cores (a check of
    # the plan's prediction for more than one).
    argv = ["bench/throughput.py", "--items", str(items), "--task", task, "--naive-items", "0",
            "--precisions", ",".join(sorted({"fp32", bare})), "--threads", str(threads),
            "--workers", "1,2" if threads >= 2 else "1", "--out", str(out)]  # fmt: skip
    report, sampler = run_bench(argv, redis_url, out, timeout=3600)
    # the job's time and a margin for the worker's warm shutdown after it
    tiers = sampler.last_seconds_of_workers(report["fleets"][0]["seconds"] + 2.0)
    after = db_footprint(database_url)
    growth = {k: after[k] - before[k] for k in before}
    batch, batch_measured = batch_figures(report, tiers, growth, bare)
    if (bench / "controlplane.py").exists():
        out = work / "controlplane.json"
        # One worker, as the throughput's costs are taken.
        argv = ["bench/controlplane.py", "--items", str(items), "--tasks", task,
                "--clients", "", "--workers", "1", "--json", str(out)]  # fmt: skip
        cp, _ = run_bench(argv, redis_url, out, timeout=3600)
        batch = BatchCost(**{**batch.__dict__, **controlplane_figures(cp, task)})
    say(f"interactive: bench/latency.py, {seconds:g} s at {levels} clients")
    out = work / "latency.json"
    argv = ["bench/latency.py", "--seconds", str(seconds), "--levels", levels, "--task", task,
            "--batch-items", "0", "--bare-texts", "0", "--threads", str(threads),
            "--out", str(out)]  # fmt: skip
    latency, _ = run_bench(argv, redis_url, out, timeout=3600)
    interactive, levels_measured = interactive_figures(latency, threads)
    return {
        "version": PROFILE_VERSION,
        "machine": machine(),
        "model": model,
        "worker_cores": threads,
        "batch": {task: batch.__dict__},
        "interactive": {task: interactive.__dict__},
        "devices": {},
        "measured": {
            "precision": precision,
            "batch": {task: batch_measured},
            "interactive": {task: levels_measured},
        },
    }


def write_profile(profile: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(profile, indent=1) + "\n")
    tmp.replace(path)


def read_profile(path: Path) -> dict:
    """The profile's JSON; a missing or unreadable file is one PlanError line."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanError(f"no profile at {path}: run `laneway calibrate` first") from None
    except (OSError, ValueError) as exc:
        raise PlanError(f"cannot read the profile {path}: {exc}") from None
