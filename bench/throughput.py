"""Fleet throughput against the bare model and against the naive design, in one run.

1. Bare model, first half: the same pipeline code (pre-processing, model, zero-shot
   post-processing) over half the texts in this process, at the best of a few batch sizes.
2. Fleet: one real `celery worker` (the command `laneway worker` runs); an N-item job goes
   through the service layer the API uses (route, COPY, chord of chunks, aggregate) and is
   timed from submission to its final status.
3. Naive design: the same worker runs one Celery task per item (`laneway.naive_item`).
4. Bare model, second half. The bare rate is N over the time of both halves, so it brackets
   the fleet run and slow drifts in the machine's speed fall on both sides alike.

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


def run_fleet(
    texts: list[str], threads: int, naive_items: int, account_type: str
) -> tuple[float, dict, dict]:
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
    argv = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "cpu,gpu,maintenance"]
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
            account, _ = create_account(session, f"bench-{uuid.uuid4().hex[:8]}", account_type)
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
                        "stage_seconds": {
                            "pre": row.pre_seconds,
                            "model": row.model_seconds,
                            "post": row.post_seconds,
                        },
                        "cost": row.cost,
                    }
                    break
            time.sleep(0.5)  # as `laneway submit --wait` polls
        naive = run_naive(texts[:naive_items], list(row.tasks), list(row.labels))
    finally:
        worker.terminate()
        worker.wait(60)
    return len(texts) / elapsed, {**info, "seconds": elapsed}, naive


def run_naive(texts: list[str], tasks: list[str], labels: list[str]) -> dict:
    """One task per item, results through the result backend, as a naive fleet would."""
    from celery import group

    from tasks.naive import naive_item

    if not texts:
        return {"items": 0}
    started = time.perf_counter()
    result = group(naive_item.s(t, tasks, labels).set(queue="cpu") for t in texts).apply_async()
    outputs = result.get(timeout=3600)
    elapsed = time.perf_counter() - started
    assert len(outputs) == len(texts)
    return {"items": len(texts), "seconds": elapsed, "items_per_s": len(texts) / elapsed}


class Bare:
    """The same pipeline code in this process, at its best batch size."""

    def __init__(self, threads: int, labels: list[str], batch_sizes: list[int], probe: list[str]):
        import torch

        from inference import Encoder
        from inference.pipeline import Pipeline

        torch.set_num_threads(threads)
        self.encoder = Encoder()
        self.pipeline = Pipeline(lambda task: self.encoder)
        self.labels = labels
        self.pipeline.run(probe[:64], ["classify"], labels)  # warm up
        self.probe = {}
        for size in batch_sizes:
            self.encoder.batch_size = size
            t = time.perf_counter()
            self.pipeline.run(probe, ["classify"], labels)
            self.probe[size] = len(probe) / (time.perf_counter() - t)
        self.batch_size = max(self.probe, key=self.probe.get)
        self.encoder.batch_size = self.batch_size
        self.seconds = 0.0
        self.items = 0

    def run(self, texts: list[str]) -> None:
        t = time.perf_counter()
        self.pipeline.run(texts, ["classify"], self.labels)
        self.seconds += time.perf_counter() - t
        self.items += len(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20000)
    parser.add_argument("--naive-items", type=int, default=2000, help="0 skips the naive run")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    parser.add_argument(
        "--account-type",
        default="enterprise",
        help="enterprise/standard: the gpu lane above the threshold; trial/demo: the cpu lane",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch-sizes", default="16,32,64")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    from laneway.redis_conn import embedded_redis
    from laneway.settings import get_settings

    settings = get_settings()
    texts = load_texts(args.items)
    labels = list(settings.default_labels)
    half = len(texts) // 2
    bare = Bare(args.threads, labels, [int(x) for x in args.batch_sizes.split(",")], texts[:1000])
    bare.run(texts[:half])
    with embedded_redis(settings):
        fleet_rate, fleet, naive = run_fleet(
            texts, args.threads, args.naive_items, args.account_type
        )
    bare.run(texts[half:])
    bare_rate = bare.items / bare.seconds
    report = {
        "items": args.items,
        "threads": args.threads,
        "chunk_size": settings.chunk_size,
        "model_batch_size": settings.batch_size,
        "database": settings.database_url.split(":", 1)[0],
        "fleet_items_per_s": round(fleet_rate, 1),
        "fleet": fleet,
        "bare_items_per_s": round(bare_rate, 1),
        "bare_batch_size": bare.batch_size,
        "bare_probe": {str(k): round(v, 1) for k, v in bare.probe.items()},
        "ratio": round(fleet_rate / bare_rate, 3),
        "naive": naive,
        "fleet_over_naive": round(fleet_rate / naive["items_per_s"], 2) if naive["items"] else None,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    if args.json:
        print(json.dumps(report))
        return
    print(f"items            {args.items} ({settings.database_url.split(':', 1)[0]})")
    print(f"lane             {fleet['lane']}")
    print(
        f"fleet            {fleet_rate:8.1f} items/s  ({fleet['seconds']:.1f} s, {fleet['status']})"
    )
    print(f"bare model       {bare_rate:8.1f} items/s  (batch {bare.batch_size})")
    print(f"fleet / bare     {report['ratio']:8.3f}")
    if naive["items"]:
        print(f"naive, per item  {naive['items_per_s']:8.1f} items/s  ({naive['items']} items)")
        print(f"fleet / naive    {report['fleet_over_naive']:8.2f}")
    cost = fleet.get("cost") or {}
    if cost:
        device = "gpu" if cost["seconds"]["model_gpu"] else "cpu"
        print(f"cost per item    ${cost['per_item']:.8f} (model stage on {device})")


if __name__ == "__main__":
    main()
