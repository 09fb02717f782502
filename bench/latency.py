"""Interactive latency: single-item sync requests from 1, 8 and 64 concurrent clients, on
an idle fleet and while a batch job runs on the same machine, against the bare model.

1. Bare model: the same pipeline code in this process, batched at its best batch size
   (bench/throughput.py's `Bare`) at the best precision the CPU computes (the fleet's auto
   rule: bf16 where native, else fp16 weights on AVX2), over distinct texts: items/s.
2. Idle: the web app (gunicorn, `laneway web`) and the interactive worker (`laneway worker
   interactive`); each client sends one-item POST /v1/classify requests back to back over
   one keep-alive connection (http.client: a cheap client, since it shares the CPU) for
   --seconds per level: p50/p99 latency and requests/s, and per stage (the Server-Timing
   header: broker, batch wait, run, reply) the median.
3. Loaded: the batch cpu workers `laneway fleet` would start here (`--batch-workers`; niceness
   LANEWAY_BATCH_NICE, a thread fewer while busy, sharing the --threads cores) run a
   --batch-items job (trial account, cpu lane), and the same levels run again while they do.

4. Peers (`--peers`, e.g. infinity-torch-bfloat16,infinity-optimum,litserve,ray): between
   the idle and the loaded levels, Laneway's web and interactive worker stop and each peer
   model server runs alone on the machine, started by the side-by-side harness
   (../shared/peers: its servers, its request shapes, built by its install.sh under
   /tmp/peers), through the same clients and levels, for every text set. `--task embed` asks
   Laneway the peers' question (one embedding per request).

Texts (`--texts`): `messages`, the sample customer messages (8-60 words, what a demo user
sends), and `peers`, the harness's package summaries (shorter: what the peers' figures were
taken with); every text is distinct and the result cache is off, so every request reaches
the model. Runs on whatever LANEWAY_DATABASE_URL / LANEWAY_REDIS_URL name (Postgres and
Redis needed).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["LANEWAY_CACHE_TTL"] = "0"

BIN = Path(sys.executable).parent
LABELS = ["billing", "shipping and delivery", "product quality", "account and login"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def parse_timing(header: str | None) -> dict[str, float]:
    out = {}
    for part in (header or "").split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            out[name] = float(dur)
    return out


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each named process and its children
    (this process alone: the others are its children)."""
    import psutil

    out = {}
    for name, pid in pids.items():
        try:
            root = psutil.Process(pid)
            procs = [root] if pid == os.getpid() else [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        out[name] = total
    return out


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def local_redis_pid(url: str) -> int | None:
    """The Redis server's pid when it runs on this machine (its CPU per request is shown
    beside Laneway's own processes: the peers need no Redis), else None."""
    return local_listener(url, 6379)


def local_listener(url: str, default_port: int) -> int | None:
    """The pid listening on `url`'s port (`default_port` when it names none) when `url`
    names this machine, else None."""
    from urllib.parse import urlsplit

    import psutil

    where = urlsplit(url)
    if where.hostname not in LOCAL_HOSTS:
        return None
    try:
        listening = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return None
    return next(
        (c.pid for c in listening
         if c.status == psutil.CONN_LISTEN and c.laddr.port == (where.port or default_port)
         and c.pid),
        None,
    )  # fmt: skip


class Laneway:
    """One text per request to Laneway's interactive endpoint for `task`."""

    def __init__(self, port: int, key: str, task: str) -> None:
        self.name, self.port, self.task = "laneway", port, task
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def w1(self, text: str) -> tuple[str, bytes]:
        body: dict = {"items": [{"id": "1", "text": text}]}
        if self.task == "classify":
            body["labels"] = LABELS
        return f"/v1/{self.task}", json.dumps(body).encode()


class Texts:
    """Distinct texts, handed out once each, from a list (repeated with a suffix when a
    long run uses them all)."""

    def __init__(self, base: list[str]) -> None:
        self.base, self.n, self.lock = base, 0, threading.Lock()

    def next(self) -> str:
        with self.lock:
            n, self.n = self.n, self.n + 1
        text = self.base[n % len(self.base)]
        return text if n < len(self.base) else f"{text} (again {n})"


def message_texts() -> list[str]:
    """The sample customer messages (examples/customer_messages.csv)."""
    import csv

    with open(ROOT / "examples" / "customer_messages.csv", newline="") as fh:
        return [row["text"] for row in csv.DictReader(fh)]


def peer_texts(n: int = 20000) -> list[str]:
    """The side-by-side harness's texts: package summaries of six words or more from the
    tool library's package list (../.library/env/packages/pypi.tsv), distinct."""
    path = Path(os.environ.get("PEERS_TEXTS", ROOT.parent / ".library/env/packages/pypi.tsv"))
    out, seen = [], set()
    with path.open(encoding="utf-8", errors="replace") as fh:
        next(fh)
        for line in fh:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 5 and len(parts[4].split()) >= 6 and parts[4] not in seen:
                seen.add(parts[4])
                out.append(parts[4])
                if len(out) >= n:
                    break
    return out


def words(texts: list[str]) -> dict[str, float]:
    counts = sorted(len(t.split()) for t in texts)
    return {"median": statistics.median(counts), "p10": counts[len(counts) // 10],
            "p90": counts[9 * len(counts) // 10]}  # fmt: skip


def run_level(target, clients: int, seconds: float, texts: Texts, pids: dict[str, int]) -> dict:  # noqa: ANN001
    """`clients` threads, each on its own keep-alive connection, for `seconds`."""
    latencies: list[float] = []
    stages: list[dict[str, float]] = []
    errors: list[str] = []
    stop = time.perf_counter() + seconds
    lock = threading.Lock()
    port, headers = target.port, target.headers

    def client(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine, mine_stages, i = [], [], 0
        while time.perf_counter() < stop:
            path, body = target.w1(texts.next())
            started = time.perf_counter()
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
            data = response.read()
            elapsed = time.perf_counter() - started
            if response.status != 200:
                with lock:
                    errors.append(f"{response.status} {data[:200]!r}")
                continue
            mine.append(elapsed)
            mine_stages.append(parse_timing(response.getheader("Server-Timing")))
            i += 1
        conn.close()
        with lock:
            latencies.extend(mine)
            stages.extend(mine_stages)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    cpu_before = cpu_seconds({**pids, "bench client": os.getpid()})
    wall = run_all(threads)
    cpu_after = cpu_seconds({**pids, "bench client": os.getpid()})
    n = max(1, len(latencies))
    cpu_ms = {k: round(1000 * (cpu_after[k] - cpu_before[k]) / n, 2) for k in cpu_after}
    names = sorted({k for s in stages for k in s})
    # Where the tail's time went: the slowest requests' own stages (Server-Timing).
    slowest = sorted(zip(latencies, stages, strict=True), key=lambda x: -x[0])[:5]
    # and the slowest 3 % together: each stage's mean there, beside the median below.
    tail = slowest_share(latencies, stages, 0.03)
    return {
        "system": target.name,
        "clients": clients,
        "requests": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "p50_ms": round(1000 * percentile(latencies, 0.50), 1) if latencies else None,
        "p99_ms": round(1000 * percentile(latencies, 0.99), 1) if latencies else None,
        "requests_per_s": round(len(latencies) / wall, 1),
        # CPU per request by process: robust to a shared machine, unlike wall time.
        "cpu_ms_per_request": cpu_ms,
        "stage_median_ms": {
            k: round(statistics.median(s[k] for s in stages if k in s), 2) for k in names
        },
        "tail_ms": tail,
        "slowest_ms": [{"total": round(1000 * t, 1), **s} for t, s in slowest],
    }


def slowest_share(latencies: list[float], stages: list[dict[str, float]], share: float) -> dict:
    """The slowest `share` of the requests: their mean total and each stage's mean (ms);
    a stage a request's Server-Timing lacks (a peer's, say) counts as absent."""
    if not latencies:
        return {}
    pairs = sorted(zip(latencies, stages, strict=True), key=lambda x: -x[0])
    slow = pairs[: max(1, round(share * len(pairs)))]
    names = sorted({k for _, s in slow for k in s})
    means = {k: round(statistics.mean(s[k] for _, s in slow if k in s), 2) for k in names}
    return {"share": share, "total": round(1000 * statistics.mean(t for t, _ in slow), 2), **means}


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def start(name: str, argv: list[str], env: dict[str, str], logdir: Path) -> subprocess.Popen:
    log = open(logdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        argv, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, cwd=ROOT,
    )  # fmt: skip


def run_all(threads: list[threading.Thread]) -> float:
    """Start every client thread at once and wait for all: the wall seconds they took."""
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def web_healthy(port: int) -> bool:
    """Whether the web app on `port` answers its health check."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False


def load_peers_harness():  # noqa: ANN201
    """../shared/peers/bench.py, by path (its name would clash with this bench/ package)."""
    import importlib.util

    path = ROOT.parent / "shared" / "peers" / "bench.py"
    spec = importlib.util.spec_from_file_location("peers_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per level")
    parser.add_argument("--levels", default="1,8,64")
    parser.add_argument(
        "--batch-items", type=int, default=20000, help="the batch job's items (0: idle only)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the cores)")
    parser.add_argument(
        "--batch-workers", type=int, default=0,
        help="cpu workers of the loaded levels' batch job (default: as `laneway fleet` starts)",
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--task", default="classify", choices=("classify", "embed"))
    parser.add_argument("--texts", default="messages", help="comma list of: messages, peers")
    parser.add_argument("--peers", default="", help="comma list of the harness's systems")
    parser.add_argument("--peers-model", default="/tmp/peers/model/all-MiniLM-L6-v2")
    parser.add_argument(
        "--bare-texts",
        type=int,
        default=4000,
        help="the bare model's texts, half before and half after the idle levels "
        "(0: no bare model, as `laneway calibrate` runs it: it reads the levels only)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    sources = {"messages": message_texts, "peers": peer_texts}
    text_sets = {name: sources[name]() for name in args.texts.split(",")}
    peers = [x for x in args.peers.split(",") if x]

    import signal
    import socket
    import tempfile
    import uuid

    from bench.throughput import Bare, load_texts
    from core.config.settings import get_settings
    from db.accounts import create_account
    from db.migrate import upgrade
    from db.models import Chunk, Job
    from db.session import session_scope
    from fleet.processes import cpu_worker_count
    from inference.precision import choose
    from jobs.submit import submit_job
    from tasks import app

    settings = get_settings()
    upgrade(settings)
    batch_workers = args.batch_workers or cpu_worker_count(settings)
    logdir = Path(tempfile.mkdtemp(prefix="laneway-latency-"))
    env = {"LANEWAY_TORCH_THREADS": str(args.threads), "LANEWAY_CACHE_TTL": "0"}
    procs: list[subprocess.Popen] = []
    report: dict = {
        "load_average_start": os.getloadavg(),
        "speed_probe_start_s": speed_probe(),
        "cpus": os.cpu_count(),
        "task": args.task,
        "texts": {name: words(texts) for name, texts in text_sets.items()},
    }
    host = socket.gethostname()

    def stop_all(which: list[subprocess.Popen]) -> None:
        for proc in reversed(which):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in which:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def healthy() -> bool:
        return web_healthy(args.port)

    def start_laneway() -> tuple[list[subprocess.Popen], dict[str, int]]:
        """The web app and the interactive worker, up and warm."""
        web = start("web", [str(BIN / "laneway"), "web", "--port", str(args.port)], env, logdir)
        node = f"interactive-bench-{uuid.uuid4().hex[:4]}"
        worker_argv = [str(BIN / "laneway"), "worker", "interactive", "--name", node]
        worker = start(f"interactive-{node}", worker_argv, env, logdir)
        procs.extend([web, worker])

        def up() -> bool:
            log = (logdir / f"interactive-{node}.log").read_bytes()
            pong = app.control.ping(destination=[f"{node}@{host}"], timeout=0.5)
            return bool(pong) and b"loaded in pid" in log

        wait_for(up, 180, "the interactive worker")
        wait_for(healthy, 120, "the web app")
        pids = {"web": web.pid, "interactive worker": worker.pid}
        redis_pid = local_redis_pid(settings.redis_url)
        if redis_pid is not None:
            pids["redis (shared)"] = redis_pid
        return [web, worker], pids

    def levels_for(target, pids: dict[str, int], label: str) -> dict[str, list[dict]]:  # noqa: ANN001
        out = {}
        for name, texts in text_sets.items():
            source = Texts(texts)
            run_level(target, 4, 2.0, source, pids)  # warm-up
            out[name] = [run_level(target, c, args.seconds, source, pids) for c in levels]
            for level in out[name]:
                print(
                    f"{label} {name} c={level['clients']}: p50 {level['p50_ms']} ms, "
                    f"p99 {level['p99_ms']} ms, {level['requests_per_s']} req/s, "
                    f"cpu/request {level['cpu_ms_per_request']}",
                    flush=True,
                )
        return out

    try:
        # The baseline at the best precision this device computes (the fleet's auto rule).
        precision = choose("auto", "cpu").precision
        bare, texts = None, load_texts(max(args.bare_texts, 0))
        if texts:
            probe = texts[:1000]
            bare = Bare(args.threads, LABELS, [16, 32, 64], probe, variant=precision)
            # The other half after the idle levels: they are bracketed.
            bare.run(texts[: len(texts) // 2])

        with session_scope(settings) as session:
            account, key = create_account(session, f"latency-{uuid.uuid4().hex[:6]}", "trial")
            batch_account, _ = create_account(session, f"batch-{uuid.uuid4().hex[:6]}", "trial")
            session.expunge_all()
        # Every request counts against the account's rate limit: lift it for the run.
        env["LANEWAY_RATE_LIMIT_TRIAL"] = "1000000/minute"
        env["LANEWAY_MAX_ITEMS_TRIAL"] = str(max(args.batch_items, 1000))
        target = Laneway(args.port, key, args.task)
        serving, pids = start_laneway()
        report["idle"] = levels_for(target, pids, "laneway idle")
        if bare is not None:
            bare.run(texts[len(texts) // 2 :])
            report["bare_items_per_s"] = round(bare.items / bare.seconds, 1)
            report["bare_batch_size"] = bare.batch_size
            report["bare_precision"] = precision
            del bare

        if peers:
            # Each peer alone on the machine: Laneway's processes stop first.
            stop_all(serving)
            harness = load_peers_harness()
            report["peers"] = {}
            for name in peers:
                peer = harness.peer_for(name, args.peers_model, logdir)
                try:
                    started = peer.start()
                    print(f"{name} up in {started:.0f} s", flush=True)
                    report["peers"][name] = levels_for(
                        peer.target, {name: peer.proc.pid}, f"{name} idle"
                    )
                finally:
                    peer.stop()
            serving, pids = start_laneway()
            # Laneway idle again after the peers: the machine's speed drifts over a run, so
            # its figures bracket the peers'.
            report["idle_after_peers"] = levels_for(target, pids, "laneway idle again")

        if args.batch_items <= 0:  # the idle levels only
            finish(report, args.out)
            return
        # The batch side as `laneway fleet` runs it: its count of cpu workers, sharing the
        # cores (--threads of them) as it shares them.
        batch_env = {**env, "LANEWAY_TORCH_THREADS": str(max(1, args.threads // batch_workers))}
        for n in range(batch_workers):
            batch_node = f"cpu-bench-{uuid.uuid4().hex[:4]}"
            batch_argv = [str(BIN / "laneway"), "worker", "cpu", "--name", batch_node]
            procs.append(start(f"batch{n}", batch_argv, batch_env, logdir))
            pids[f"batch worker {n + 1}"] = procs[-1].pid
        report["batch_workers"] = batch_workers
        job_texts = load_texts(args.batch_items)
        items = [(f"b{i}", t) for i, t in enumerate(job_texts)]
        job = submit_job(batch_account, items, settings=settings)
        report["batch_job"] = {"id": str(job.id), "items": args.batch_items, "lane": job.lane}

        def chunk_done() -> bool:
            with session_scope(settings) as session:
                return session.query(Chunk).filter_by(job_id=job.id, state="done").count() > 0

        wait_for(chunk_done, 300, "the batch job under way")
        with session_scope(settings) as session:
            before = session.query(Chunk).filter_by(job_id=job.id, state="done").count()
        report["batch_job"]["chunks_done_before_levels"] = before
        report["loaded"] = levels_for(target, pids, "laneway loaded")
        with session_scope(settings) as session:
            status = session.get(Job, job.id).status
            done = session.query(Chunk).filter_by(job_id=job.id, state="done").count()
            total = session.query(Chunk).filter_by(job_id=job.id).count()
        report["batch_job"].update(status_after=status, chunks_done=f"{done}/{total}")
        finish(report, args.out)
    finally:
        stop_all(procs)
        try:
            from jobs.lifecycle import cancel_job

            if "batch_job" in report:
                cancel_job(uuid.UUID(report["batch_job"]["id"]), settings)
        except Exception as exc:  # noqa: BLE001 - best effort
            print(f"could not cancel the batch job: {exc}", file=sys.stderr)
        print(f"logs in {logdir}", file=sys.stderr)


PROBE_STEPS = 2_000_000


def speed_probe() -> float:
    """Seconds a fixed pure-Python loop takes here, the best of three: how fast the cores
    ran as a run started or ended. A shared VM's speed moves by a third within minutes, and
    with it every figure; the probe lets one run's figures be read beside another's."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(PROBE_STEPS):
            pass
        best = min(best, time.perf_counter() - started)
    return round(best, 4)


def finish(report: dict, out: str | None) -> None:
    """The run's end: its load average and speed probe into the report, printed, and
    written to `out`."""
    report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    report["speed_probe_end_s"] = speed_probe()
    print(json.dumps(report, indent=1))
    if out:
        Path(out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
