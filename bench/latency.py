"""Interactive latency: single-item sync requests from 1, 8 and 64 concurrent clients, on
an idle fleet and while a batch job runs on the same machine, against the bare model.

1. Bare model: the same pipeline code in this process, batched at its best batch size
   (bench/throughput.py's `Bare`), over distinct texts: items/s, the 64-client goal's base.
2. Idle: the web app (gunicorn, `laneway web`) and the interactive worker (`laneway worker
   interactive`); each client sends one-item POST /v1/classify requests back to back over
   one keep-alive connection (http.client: a cheap client, since it shares the CPU) for
   --seconds per level: p50/p99 latency and requests/s, and per stage (the Server-Timing
   header: broker, batch wait, run, reply) the median.
3. Loaded: a batch cpu worker (niceness LANEWAY_BATCH_NICE, a thread fewer while busy) runs a
   --batch-items job (trial account, cpu lane), and the same levels run again while it does.

Every text is distinct and the result cache is off, so every request reaches the model.
Runs on whatever LANEWAY_DATABASE_URL / LANEWAY_REDIS_URL name (Postgres and Redis needed).
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
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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


def run_level(
    port: int, key: str, clients: int, seconds: float, prefix: str, pids: dict[str, int]
) -> dict:
    """`clients` threads, each on its own keep-alive connection, for `seconds`."""
    latencies: list[float] = []
    stages: list[dict[str, float]] = []
    errors: list[str] = []
    stop = time.perf_counter() + seconds
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def client(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine, mine_stages, i = [], [], 0
        while time.perf_counter() < stop:
            text = f"{prefix} client {n} request {i}: I was charged twice for my order"
            body = json.dumps({"items": [{"id": "1", "text": text}], "labels": LABELS})
            started = time.perf_counter()
            conn.request("POST", "/v1/classify", body, headers)
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
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    cpu_after = cpu_seconds({**pids, "bench client": os.getpid()})
    n = max(1, len(latencies))
    cpu_ms = {k: round(1000 * (cpu_after[k] - cpu_before[k]) / n, 2) for k in cpu_after}
    names = sorted({k for s in stages for k in s})
    return {
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
    }


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per level")
    parser.add_argument("--levels", default="1,8,64")
    parser.add_argument("--batch-items", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the cores)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    import signal
    import socket
    import tempfile
    import uuid

    from bench.throughput import Bare, load_texts
    from db.migrate import upgrade
    from db.models import Chunk, Job
    from db.queries import create_account
    from db.session import session_scope
    from jobs.submit import submit_job
    from laneway.settings import get_settings
    from tasks import app

    settings = get_settings()
    upgrade(settings)
    logdir = Path(tempfile.mkdtemp(prefix="laneway-latency-"))
    env = {"LANEWAY_TORCH_THREADS": str(args.threads), "LANEWAY_CACHE_TTL": "0"}
    procs: list[subprocess.Popen] = []
    report: dict = {"load_average_start": os.getloadavg(), "cpus": os.cpu_count()}
    try:
        bare = Bare(args.threads, LABELS, [16, 32, 64], load_texts(1000))
        texts = load_texts(4000)
        bare.run(texts[:2000])  # the other half after the idle levels: they are bracketed

        with session_scope(settings) as session:
            account, key = create_account(session, f"latency-{uuid.uuid4().hex[:6]}", "trial")
            batch_account, _ = create_account(session, f"batch-{uuid.uuid4().hex[:6]}", "trial")
            session.expunge_all()
        # Every request counts against the account's rate limit: lift it for the run.
        env["LANEWAY_RATE_LIMIT_TRIAL"] = "1000000/minute"
        env["LANEWAY_MAX_ITEMS_TRIAL"] = str(max(args.batch_items, 1000))
        web_argv = [str(BIN / "laneway"), "web", "--port", str(args.port)]
        procs.append(start("web", web_argv, env, logdir))
        node = f"interactive-bench-{uuid.uuid4().hex[:4]}"
        argv = [str(BIN / "laneway"), "worker", "interactive", "--name", node]
        procs.append(start("interactive", argv, env, logdir))
        host = socket.gethostname()

        def up(name: str, log: str) -> bool:
            return bool(app.control.ping(destination=[f"{name}@{host}"], timeout=0.5)) and (
                b"loaded in pid" in (logdir / log).read_bytes()
            )

        wait_for(lambda: up(node, "interactive.log"), 180, "the interactive worker")

        def healthy() -> bool:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=5)
                conn.request("GET", "/healthz")
                return conn.getresponse().status == 200
            except OSError:
                return False

        wait_for(healthy, 120, "the web app")
        pids = {"web": procs[0].pid, "interactive worker": procs[1].pid}
        run_level(args.port, key, 4, 2.0, "warm-up", pids)
        report["idle"] = [
            run_level(args.port, key, c, args.seconds, f"idle {c}", pids) for c in levels
        ]
        bare.run(texts[2000:])
        report["bare_items_per_s"] = round(bare.items / bare.seconds, 1)
        report["bare_batch_size"] = bare.batch_size
        del bare
        print(json.dumps(report["idle"], indent=1), flush=True)

        batch_node = f"cpu-bench-{uuid.uuid4().hex[:4]}"
        batch_argv = [str(BIN / "laneway"), "worker", "cpu", "--name", batch_node]
        procs.append(start("batch", batch_argv, env, logdir))
        pids["batch worker"] = procs[2].pid
        job_texts = load_texts(args.batch_items)
        items = [(f"b{i}", t) for i, t in enumerate(job_texts)]
        job = submit_job(batch_account, items, settings=settings)
        report["batch_job"] = {"id": str(job.id), "items": args.batch_items, "lane": job.lane}

        def chunk_done() -> bool:
            with session_scope(settings) as session:
                return session.query(Chunk).filter_by(job_id=job.id, state="done").count() > 0

        wait_for(chunk_done, 300, "the batch job under way")
        report["loaded"] = [
            run_level(args.port, key, c, args.seconds, f"loaded {c}", pids) for c in levels
        ]
        with session_scope(settings) as session:
            status = session.get(Job, job.id).status
            done = session.query(Chunk).filter_by(job_id=job.id, state="done").count()
            total = session.query(Chunk).filter_by(job_id=job.id).count()
        report["batch_job"].update(status_after=status, chunks_done=f"{done}/{total}")
        report["load_average_end"] = os.getloadavg()
        idle, loaded = report["idle"], report["loaded"]
        report["loaded_over_idle_p99"] = {
            str(i["clients"]): round(lo["p99_ms"] / i["p99_ms"], 2)
            for i, lo in zip(idle, loaded, strict=True)
        }
        top = max(idle, key=lambda x: x["clients"])
        report["top_clients_over_bare"] = round(
            top["requests_per_s"] / report["bare_items_per_s"], 3
        )
        print(json.dumps(report, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        try:
            from jobs.lifecycle import cancel_job

            if "batch_job" in report:
                cancel_job(uuid.UUID(report["batch_job"]["id"]), settings)
        except Exception as exc:  # noqa: BLE001 - best effort
            print(f"could not cancel the batch job: {exc}", file=sys.stderr)
        print(f"logs in {logdir}", file=sys.stderr)


if __name__ == "__main__":
    main()
