"""Should pre- and post-processing run as separate CPU tasks, off the GPU worker?

Measures, per chunk of real texts, in one process:
- the three stages as the chunk task runs them (pre: clean + tokenize; model; post:
  zero-shot scoring and formatting);
- what a split design would add on the model worker for each chunk: fetching the
  tokenized batches from Redis and storing the raw model outputs back (serialize +
  round trip), plus the two extra Celery hops it needs (apply_async -> worker -> result).

Splitting frees the device worker of pre + post per chunk but costs it the hand-off; it pays
only when pre + post is larger than the hand-off. Prints both, per chunk and per item.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/13")
    args = parser.parse_args()

    import redis
    import torch
    from throughput import load_texts

    from core.vocab import DEFAULT_LABELS
    from inference import Encoder
    from inference.pipeline import LABEL_TEMPLATE, Pipeline
    from inference.text import clean

    torch.set_num_threads(args.threads)
    labels = list(DEFAULT_LABELS)
    texts = load_texts(args.chunks * args.chunk_size)
    encoder = Encoder()
    pipeline = Pipeline(lambda task: encoder)
    pipeline.run(texts[:64], ["classify"], labels)
    encoder.encode([LABEL_TEMPLATE.format(x) for x in labels])
    r = redis.Redis.from_url(args.redis)

    stages: dict[str, list[float]] = {"pre": [], "model": [], "post": [], "handoff": []}
    for c in range(args.chunks):
        chunk = texts[c * args.chunk_size : (c + 1) * args.chunk_size]
        _, times = pipeline.run(chunk, ["classify"], labels)
        stages["pre"].append(times.pre)
        stages["model"].append(times.model)
        stages["post"].append(times.post)
        # The split design's extra work on the model worker for this chunk.
        prepared = encoder.prepare([clean(t) for t in chunk])
        buf = io.BytesIO()
        torch.save(prepared.batches, buf)
        r.set("stages:tokens", buf.getvalue())  # written by the pre task (not on the device)
        started = time.perf_counter()
        prepared.batches = torch.load(io.BytesIO(r.get("stages:tokens")), weights_only=False)
        fetched = time.perf_counter() - started
        vectors = encoder.forward(prepared)  # the model stage itself is not hand-off
        started = time.perf_counter()
        out = io.BytesIO()
        torch.save(vectors, out)
        r.set("stages:vectors", out.getvalue())
        stages["handoff"].append(fetched + time.perf_counter() - started)
    r.delete("stages:tokens", "stages:vectors")

    hop = celery_hop_ms()
    n = args.chunk_size
    med = {k: statistics.median(v) for k, v in stages.items()}
    print(f"per chunk of {n} items (median of {args.chunks}), {args.threads} torch threads")
    for key in ("pre", "model", "post"):
        print(f"  {key:<8} {med[key] * 1000:9.1f} ms   {med[key] / n * 1e6:8.1f} us/item")
    print(f"  handoff  {med['handoff'] * 1000:9.1f} ms   (tokens in, vectors out, via Redis)")
    print(f"  2 hops   {2 * hop:9.1f} ms   (Celery round trip {hop:.1f} ms median)")
    cpu_side = med["pre"] + med["post"]
    split_cost = med["handoff"] + 2 * hop / 1000
    print(f"pre + post on the device worker: {cpu_side * 1000:.1f} ms per chunk")
    print(f"what splitting adds around it:   {split_cost * 1000:.1f} ms per chunk")
    print("=> split pays" if cpu_side > split_cost else "=> keep the stages in the chunk task")


def celery_hop_ms(samples: int = 50) -> float:
    """Median apply_async().get() round trip of a no-op task, on a solo worker."""
    import subprocess

    from celery import Celery

    url = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/13")
    app = Celery("hop", broker=url, backend=url)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "hop_app", "worker", "-P", "solo", "-Q", "hop",
         "--loglevel", "WARNING"],
        cwd=ROOT / "bench", env={**os.environ, "BENCH_REDIS": url},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        noop = app.signature("hop.noop", queue="hop")
        noop.apply_async().get(timeout=60)  # waits for the worker
        times = []
        for _ in range(samples):
            t = time.perf_counter()
            noop.apply_async().get(timeout=10)
            times.append((time.perf_counter() - t) * 1000)
        return statistics.median(times)
    finally:
        worker.terminate()
        worker.wait(30)


if __name__ == "__main__":
    main()
