"""Fleet throughput against the bare model, measured in the same run.

1. Start one real `celery worker` (the same command `laneway worker` runs) and wait until
   its model is loaded.
2. Submit an N-item job through the service layer the API uses (route, COPY, chord) and
   time it from submission to the job's final status.
3. Stop the worker, then run the bare model (the same pre-processing, model and zero-shot
   post-processing) over the same texts in this process at its best batch size.
4. Print both in items/s and their ratio.

Runs on whatever LANEWAY_DATABASE_URL / LANEWAY_REDIS_URL name; with neither set, on the
embedded default in a temporary LANEWAY_HOME.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if not os.environ.get("LANEWAY_DATABASE_URL") and not os.environ.get("LANEWAY_HOME"):
    os.environ["LANEWAY_HOME"] = tempfile.mkdtemp(prefix="laneway-bench-")


def load_texts(n: int) -> list[str]:
    with open(ROOT / "examples" / "customer_messages.csv", newline="") as fh:
        base = [row["text"] for row in csv.DictReader(fh)]
    # Distinct texts (a later result cache must not turn repeats into free work).
    return [f"{base[i % len(base)]} (ref {i})" for i in range(n)]


def run_fleet(texts: list[str], threads: int) -> tuple[float, dict]:
    import uuid

    from db.migrate import upgrade
    from db.models import FINAL_JOB_STATUSES, Job
    from db.queries import create_account
    from db.session import session_scope
    from laneway.jobs import submit_job
    from laneway.settings import get_settings
    from tasks import app

    settings = get_settings()
    upgrade(settings)
    node = f"bench-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
    env = {
        **os.environ,
        "LANEWAY_GPU_FALLBACK": "cpu",
        "LANEWAY_DEVICE": "cpu",
        "LANEWAY_TORCH_THREADS": str(threads),
    }
    settings.home.mkdir(parents=True, exist_ok=True)
    log = open(settings.home / "bench-worker.log", "wb")  # noqa: SIM115
    argv = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "cpu,gpu"]
    worker = subprocess.Popen(
        argv + ["-n", node, "-c", "1", "--loglevel", "INFO"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not (
            app.control.ping(destination=[node], timeout=0.5)
            and b"loaded in pid" in (settings.home / "bench-worker.log").read_bytes()
        ):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the bench worker did not start; see bench-worker.log")
        with session_scope(settings) as session:
            account, _ = create_account(session, f"bench-{uuid.uuid4().hex[:8]}", "enterprise")
            session.expunge(account)
        items = [(f"b-{i}", text) for i, text in enumerate(texts)]
        started = time.perf_counter()
        job = submit_job(account, items, settings=settings)
        while True:
            with session_scope(settings) as session:
                row = session.get(Job, job.id)
                if row.status in FINAL_JOB_STATUSES:
                    elapsed = time.perf_counter() - started
                    info = {
                        "status": row.status,
                        "lane": row.lane,
                        "succeeded": row.succeeded_items,
                        "model_seconds": row.model_seconds,
                    }
                    break
            time.sleep(0.05)
    finally:
        worker.terminate()
        worker.wait(60)
    return len(texts) / elapsed, {**info, "seconds": elapsed}


def run_bare(texts: list[str], threads: int, labels: list[str], batch_sizes: list[int]) -> dict:
    import torch

    from inference import Encoder, ZeroShotClassifier

    torch.set_num_threads(threads)
    classifier = ZeroShotClassifier(Encoder())
    classifier.classify(texts[:64], labels)  # warm up
    probe = texts[: min(len(texts), 1000)]
    timings = {}
    for size in batch_sizes:
        classifier.encoder.batch_size = size
        t = time.perf_counter()
        classifier.classify(probe, labels)
        timings[size] = len(probe) / (time.perf_counter() - t)
    best = max(timings, key=timings.get)
    classifier.encoder.batch_size = best
    t = time.perf_counter()
    classifier.classify(texts, labels)
    return {"items_per_s": len(texts) / (time.perf_counter() - t), "batch_size": best,
            "probe": {str(k): round(v, 1) for k, v in timings.items()}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch-sizes", default="16,32,64")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    from laneway.redis_conn import embedded_redis
    from laneway.settings import get_settings

    settings = get_settings()
    texts = load_texts(args.items)
    with embedded_redis(settings):
        fleet_rate, fleet = run_fleet(texts, args.threads)
    bare = run_bare(
        texts, args.threads, list(settings.default_labels),
        [int(x) for x in args.batch_sizes.split(",")],
    )  # fmt: skip
    report = {
        "items": args.items,
        "threads": args.threads,
        "chunk_size": settings.chunk_size,
        "model_batch_size": settings.batch_size,
        "database": settings.database_url.split(":", 1)[0],
        "fleet_items_per_s": round(fleet_rate, 1),
        "fleet": fleet,
        "bare_items_per_s": round(bare["items_per_s"], 1),
        "bare": bare,
        "ratio": round(fleet_rate / bare["items_per_s"], 3),
    }
    if args.json:
        print(json.dumps(report))
        return
    print(f"items            {args.items} ({settings.database_url.split(':', 1)[0]})")
    print(
        f"fleet            {fleet_rate:8.1f} items/s  ({fleet['seconds']:.1f} s, {fleet['status']})"
    )
    print(f"bare model       {bare['items_per_s']:8.1f} items/s  (batch {bare['batch_size']})")
    print(f"fleet / bare     {report['ratio']:8.3f}")


if __name__ == "__main__":
    main()
