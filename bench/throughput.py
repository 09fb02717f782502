"""Fleet throughput against the bare model at its best precision, and against the naive design.

1. Bare model, first half: the same pipeline code (pre-processing, model, post-processing
   of the task) over half the texts in this process, on every core, texts sorted by length,
   at the best of a few batch sizes; once per precision this CPU offers (fp32, and bf16
   where torch says the CPU computes it natively).
2. Precision check: bf16 against fp32 on a sample (embeddings within cosine 0.999,
   zero-shot labels unchanged for 99 %, ratings within 0.02). The baseline is the fastest
   precision that passes: what the same hardware gives a user who runs the model alone.
3. Fleet, as shipped: the cpu workers `laneway fleet` starts on this host (`--workers auto`:
   LANEWAY_CPU_WORKERS, one per core by default, sharing the cores), each the command line
   and environment of `laneway worker cpu` (fleet/processes.py) with default settings (its
   own precision, niceness, the result cache); an N-item job goes through the service layer the
   API uses (route, COPY, chunks sent a window at a time by fair share, the job settled by
   its last chunk) and is timed from submission to its final status. With --tuned, a
   second fleet run with the given settings, labelled so.
4. Naive design: the same worker runs one Celery task per item (`laneway.naive_item`,
   bench/naive.py, which the worker loads through `--include`; production workers do not).
5. Bare model, second half. Each bare rate is N over the time of both halves, so it brackets
   the fleet runs and slow drifts in the machine's speed fall on both sides alike.

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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.config.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if not os.environ.get("LANEWAY_DATABASE_URL") and not os.environ.get("LANEWAY_HOME"):
    os.environ["LANEWAY_HOME"] = tempfile.mkdtemp(prefix="laneway-bench-")

# The naive baseline's task module, loaded by the bench worker alone (celery --include).
NAIVE_MODULE = "bench.naive"


def load_texts(n: int) -> list[str]:
    with open(ROOT / "examples" / "customer_messages.csv", newline="") as fh:
        base = [row["text"] for row in csv.DictReader(fh)]
    # Distinct texts (a later result cache must not turn repeats into free work).
    return [f"{base[i % len(base)]} (ref {i})" for i in range(n)]


def cpu_precisions() -> dict[str, str]:
    """The bare-model variants this CPU computes natively, by name, with the Encoder
    precision each loads: fp32 always; where the inference layer finds native bf16
    (inference/precision.py), `bf16` as the workers run it (matrix products in bf16 under
    autocast, the rest fp32) and `bf16-pure` (every weight and activation in bf16: faster,
    and checked against the same tolerance, which it may fail)."""
    from inference.precision import native_bf16_cpu

    found = {"fp32": "fp32"}
    if native_bf16_cpu():
        found["bf16"] = "bf16"
        found["bf16-pure"] = "bf16-pure"
    return found


class Bare:
    """The same pipeline code in this process, at its best batch size."""

    def __init__(
        self,
        threads: int,
        labels: list[str],
        batch_sizes: list[int],
        probe: list[str],
        task: str = "classify",
        variant: str = "fp32",
    ):
        import torch

        from inference.encoder import Encoder
        from inference.pipeline import Pipeline

        torch.set_num_threads(threads)
        if variant == "bf16-pure":
            # Every weight and activation in bf16 is transformers' forward: the packed one
            # (inference/packed.py) shares the fp32 model's weights and pools in fp32.
            self.encoder = Encoder(precision="fp32", packed=False)
            self.encoder.model = self.encoder.model.to(torch.bfloat16)
        else:
            self.encoder = Encoder(precision=variant)
        self.pipeline = Pipeline(lambda task: self.encoder)
        self.labels, self.tasks = labels, [task]
        self.pipeline.run(probe[:64], self.tasks, labels)  # warm up
        self.probe = {}
        for size in batch_sizes:
            self.encoder.batch_size = size
            t = time.perf_counter()
            self.pipeline.run(probe, self.tasks, labels)
            self.probe[size] = len(probe) / (time.perf_counter() - t)
        self.batch_size = max(self.probe, key=self.probe.get)
        self.encoder.batch_size = self.batch_size
        self.seconds = 0.0
        self.items = 0

    def run(self, texts: list[str]) -> None:
        t = time.perf_counter()
        self.pipeline.run(texts, self.tasks, self.labels)
        self.seconds += time.perf_counter() - t
        self.items += len(texts)

    @property
    def rate(self) -> float:
        return self.items / self.seconds


def precision_check(reference: Bare, other: Bare, texts: list[str]) -> dict:
    """`other` against `reference` (fp32) on `texts`: embedding cosine, zero-shot label
    agreement, anchor ratings; `ok` when all three are within the tolerance."""
    from inference.accuracy import TOLERANCE
    from inference.pipeline import LABEL_TEMPLATE, anchor_ratings

    prompts = [LABEL_TEMPLATE.format(x) for x in reference.labels]
    anchors = list(reference.pipeline.score_anchors)

    def views(bare: Bare):  # noqa: ANN202 - embeddings, zero-shot labels, ratings
        vectors = bare.encoder.encode(texts)
        labels = (vectors @ bare.encoder.encode(prompts).T).argmax(1)
        return vectors, labels, anchor_ratings(vectors, bare.encoder.encode(anchors))

    (a, labels_a, ratings_a), (b, labels_b, ratings_b) = views(reference), views(other)
    cosine = (a * b).sum(1)
    report = {
        "texts": len(texts),
        "cosine_min": round(float(cosine.min()), 6),
        "cosine_mean": round(float(cosine.mean()), 6),
        "label_agreement": round(float((labels_a == labels_b).float().mean()), 4),
        "rating_max_diff": round(
            max(abs(x - y) for x, y in zip(ratings_a, ratings_b, strict=True)), 4
        ),
    }
    # The same tolerance every worker's start-up check applies (inference/precision.py).
    report["ok"] = (
        report["cosine_min"] >= TOLERANCE.cosine
        and report["label_agreement"] >= TOLERANCE.labels
        and report["rating_max_diff"] <= TOLERANCE.rating
    )
    return report


def bench_worker_argv(settings: Settings, node: str) -> list[str]:
    """`laneway worker cpu`'s command line, named `node`, with the naive task included."""
    from fleet.processes import worker_argv

    return [*worker_argv("cpu", settings, name=node), "--include", NAIVE_MODULE]


def run_fleet(
    texts: list[str],
    task: str,
    account_type: str,
    naive_items: int,
    extra_env: dict[str, str],
    label: str,
    labels: list[str] | None = None,
    outputs: list | None = None,
    workers: int = 1,
) -> dict:
    """`workers` cpu workers as `laneway fleet` starts them (with `extra_env` beside
    the defaults, and the naive task included) run an N-item job;
    then, with naive_items, one task per item. Returns the job's figures; `outputs`, when
    given, receives every item's result in item order (read after the timing ends)."""
    import uuid

    from core.config.settings import get_settings
    from db.accounts import create_account
    from db.models import FINAL_JOB_STATUSES, Job
    from db.session import session_scope
    from fleet.processes import cpu_worker_env, thread_share
    from jobs.submit import submit_job
    from tasks import app

    settings = get_settings()
    run = uuid.uuid4().hex[:6]
    nodes = [f"bench-{run}-{n}" for n in range(workers)]
    shared = cpu_worker_env(settings, workers)
    env = {**os.environ, **shared, **extra_env}
    # What the workers ran with beside the defaults, their share of the cores included.
    chosen = thread_share(settings, workers) | extra_env
    settings.home.mkdir(parents=True, exist_ok=True)
    logfiles = [settings.home / f"bench-worker-{node}.log" for node in nodes]
    procs = []
    for node, logfile in zip(nodes, logfiles, strict=True):
        log = open(logfile, "wb")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                bench_worker_argv(settings, node), env=env, stdout=log,
                stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            )
        )  # fmt: skip
    logfile = logfiles[0]
    try:
        deadline = time.monotonic() + 180
        destination = [f"{node}@{socket.gethostname()}" for node in nodes]
        while not (
            len(app.control.ping(destination=destination, timeout=0.5) or []) == workers
            and all(b"loaded in pid" in f.read_bytes() for f in logfiles)
        ):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                raise SystemExit(f"the bench workers did not start; see {logfiles}")
        with session_scope(settings) as session:
            account, _ = create_account(session, f"bench-{uuid.uuid4().hex[:8]}", account_type)
            session.expunge(account)
        items = [(f"b-{i}", text) for i, text in enumerate(texts)]
        started = time.perf_counter()
        job = submit_job(account, items, tasks=[task], labels=labels, settings=settings)
        while True:
            with session_scope(settings) as session:
                row = session.get(Job, job.id)
                if row.status in FINAL_JOB_STATUSES:
                    elapsed = time.perf_counter() - started
                    break
            time.sleep(0.1)  # finer than `laneway submit --wait` (0.5 s): less slack
        stages = {"pre": row.pre_seconds, "model": row.model_seconds, "post": row.post_seconds}
        info = {
            "run": label,
            "workers": workers,
            "settings": chosen or "defaults",
            "status": row.status,
            "lane": row.lane,
            "succeeded": row.succeeded_items,
            "seconds": round(elapsed, 2),
            "items_per_s": round(len(texts) / elapsed, 1),
            "stage_seconds": {k: round(v or 0.0, 3) for k, v in stages.items()},
            # Everything but the model stage, from submission to the final status.
            "outside_model_seconds": round(elapsed - (row.model_seconds or 0.0), 2),
            "cost": row.cost,
            "worker_log_lines": [
                line
                for line in logfile.read_text(errors="replace").splitlines()
                if "loaded in pid" in line
            ][:1],
        }
        info["naive"] = run_naive(texts[:naive_items], [task], list(row.labels))
        if outputs is not None:
            from sqlalchemy import select

            from core.util.vectors import join
            from db.models import Result

            with session_scope(settings) as session:
                query = (
                    select(Result.output, Result.vector)
                    .where(Result.job_id == job.id)
                    .order_by(Result.idx)
                )  # an embedding's vector is beside its output (core/util/vectors.py)
                outputs.extend(
                    None if output is None and vector is None else join(output, vector)
                    for output, vector in session.execute(query)
                )
    finally:
        for worker in procs:
            worker.terminate()  # Celery's warm shutdown
        for worker in procs:
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, 9)
                worker.wait(10)
    return info


def run_naive(texts: list[str], tasks: list[str], labels: list[str]) -> dict:
    """One task per item, results through the result backend, as a naive fleet would."""
    from celery import group

    from bench.naive import naive_item

    if not texts:
        return {"items": 0}
    started = time.perf_counter()
    result = group(naive_item.s(t, tasks, labels).set(queue="cpu") for t in texts).apply_async()
    outputs = result.get(timeout=3600)
    elapsed = time.perf_counter() - started
    assert len(outputs) == len(texts)
    return {"items": len(texts), "seconds": elapsed, "items_per_s": len(texts) / elapsed}


def env_pairs(text: str) -> dict[str, str]:
    pairs = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise SystemExit(f"--tuned takes NAME=VALUE pairs, comma-separated; not {bad}")
    return dict(p.split("=", 1) for p in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20000, help="distinct texts in the job")
    parser.add_argument("--task", default="classify", choices=["classify", "embed", "score"])
    parser.add_argument("--naive-items", type=int, default=2000, help="0 skips the naive run")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    parser.add_argument(
        "--account-type",
        default="trial",
        help="trial/demo: the cpu lane; enterprise/standard: the gpu lane above the threshold",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="bare model")
    parser.add_argument("--batch-sizes", default="16,32,64")
    parser.add_argument(
        "--precisions",
        default="",
        help="bare-model variants to run (fp32,bf16,bf16-pure); default every one this CPU offers",
    )
    parser.add_argument(
        "--tuned",
        default="",
        help="also run the fleet with these settings (NAME=VALUE,...), labelled tuned",
    )
    parser.add_argument(
        "--workers",
        default="auto",
        help="the fleet with each of these counts of cpu workers (1,2: two runs; n workers "
        "take cores/n torch threads each; auto: as many as `laneway fleet` starts here)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    from core.config.settings import get_settings
    from fleet.processes import cpu_worker_count

    shipped = cpu_worker_count(get_settings())  # LANEWAY_CPU_WORKERS, `auto` by default
    counts = [
        shipped if n.strip() == "auto" else int(n) for n in args.workers.split(",") if n.strip()
    ]
    # Refused before any work: a reduced precision is the baseline only once it passes the
    # accuracy check against fp32, which must therefore run too.
    offered = cpu_precisions()
    wanted = [p.strip() for p in args.precisions.split(",") if p.strip()] or list(offered)
    unknown = [p for p in wanted if p not in offered]
    if unknown:
        raise SystemExit(f"this CPU does not offer {unknown} natively; it offers {list(offered)}")
    if "fp32" not in wanted:
        parser.error(
            f"--precisions {args.precisions}: add fp32, which the others are checked against "
            "before one can be the baseline"
        )

    from core.store.redis_conn import embedded_redis
    from db.migrate import upgrade

    settings = get_settings()
    upgrade(settings)
    texts = load_texts(args.items)
    labels = list(settings.default_labels)
    half = len(texts) // 2
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    bares = {
        p: Bare(args.threads, labels, sizes, texts[:1000], args.task, offered[p]) for p in wanted
    }
    checks = {
        p: precision_check(bares["fp32"], bare, texts[:1000])
        for p, bare in bares.items()
        if p != "fp32" and "fp32" in bares
    }
    for bare in bares.values():
        bare.run(texts[:half])
    # n workers on this host as `laneway fleet` runs them (LANEWAY_CPU_WORKERS=n): each
    # with its share of the cores as torch threads.
    runs = [("as shipped", {}, n) if n == shipped else (f"{n} workers", {}, n) for n in counts]
    if args.tuned:
        runs.append(("tuned", env_pairs(args.tuned), counts[0]))
    with embedded_redis(settings):
        fleets = [
            run_fleet(
                texts, args.task, args.account_type, args.naive_items if n == counts[0] else 0,
                env, label, workers=n,
            )
            for label, env, n in runs
        ]  # fmt: skip
    for bare in bares.values():
        bare.run(texts[half:])
    passing = [p for p in bares if p == "fp32" or checks.get(p, {}).get("ok")]
    best = max(passing, key=lambda p: bares[p].rate)
    bare_rate = bares[best].rate
    report = {
        "items": args.items,
        "task": args.task,
        "threads": args.threads,
        "chunk_size": settings.chunk_size,
        "model_batch_size": settings.batch_size,
        "database": settings.database_url.split(":", 1)[0],
        "bare": {
            p: {
                "items_per_s": round(b.rate, 1),
                "batch_size": b.batch_size,
                "probe": {str(k): round(v, 1) for k, v in b.probe.items()},
            }
            for p, b in bares.items()
        },  # fmt: skip
        "precision_checks": checks,
        "baseline_precision": best,
        "bare_items_per_s": round(bare_rate, 1),
        "fleets": fleets,
    }
    for fleet in fleets:
        fleet["ratio"] = round(fleet["items_per_s"] / bare_rate, 3)
        # Against each precision too: a baseline that failed the check is still shown.
        fleet["ratio_by_precision"] = {
            p: round(fleet["items_per_s"] / b.rate, 3) for p, b in bares.items()
        }
        naive = fleet["naive"]
        if naive["items"]:
            fleet["over_naive"] = round(fleet["items_per_s"] / naive["items_per_s"], 2)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    if args.json:
        print(json.dumps(report))
        return
    print(f"items            {args.items} {args.task} ({report['database']})")
    for p, b in bares.items():
        mark = "  <- baseline" if p == best else ""
        print(f"bare model {p:5s} {b.rate:8.1f} items/s  (batch {b.batch_size}){mark}")
    for p, check in checks.items():
        verdict = "within" if check["ok"] else "OUTSIDE"
        print(
            f"{p} vs fp32     cosine min {check['cosine_min']}, labels "
            f"{check['label_agreement']:.2%}, ratings +-{check['rating_max_diff']}: "
            f"{verdict} the tolerance"
        )
    for fleet in fleets:
        print(
            f"fleet {fleet['run']:10s} {fleet['items_per_s']:8.1f} items/s  "
            f"({fleet['seconds']:.1f} s, {fleet['status']}, lane {fleet['lane']}; "
            f"outside the model stage {fleet['outside_model_seconds']} s)"
        )
        print(f"fleet / bare     {fleet['ratio']:8.3f}  ({fleet['run']}, baseline {best})")
        others = {p: r for p, r in fleet["ratio_by_precision"].items() if p != best}
        if others:
            print(f"                 against the other precisions: {others}")
        if fleet["naive"]["items"]:
            print(f"naive, per item  {fleet['naive']['items_per_s']:8.1f} items/s")
            print(f"fleet / naive    {fleet['over_naive']:8.2f}")
        cost = fleet.get("cost") or {}
        if cost:
            device = "gpu" if cost["seconds"]["model_gpu"] else "cpu"
            print(f"cost per item    ${cost['per_item']:.8f} (model stage on {device})")


if __name__ == "__main__":
    main()
