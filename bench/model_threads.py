"""Batches side by side against one batch on every core, in this process (issue 19): the
interactive worker runs its batches on model threads (not the main thread), one per core
with a torch thread each by default (LANEWAY_INTERACTIVE_MODEL_THREADS). Prints, for
batches of 1-32 sample messages at bf16: one model thread's forward time on every core
and on one core, and the texts per second of one model thread on every core against one
model thread per core.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/model_threads.py
"""

import csv
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["HF_HUB_OFFLINE"] = "1"
from workers.cores import openmp_env  # noqa: E402

os.environ.update(openmp_env())  # as the workers run: libgomp reads it when torch loads
import torch  # noqa: E402

from inference import Encoder  # noqa: E402

CORES = os.cpu_count() or 1
ROUNDS = 60


def texts() -> list[str]:
    with open("examples/customer_messages.csv", newline="") as f:
        rows = [row[1] for row in csv.reader(f)][1:]
    return [f"{t} #{i}" for i, t in enumerate((rows * 20)[:4000])]


def batches(sample: list[str], size: int, offset: int = 0, rounds: int = ROUNDS):
    for n in range(rounds):
        start = (offset + n * size) % (len(sample) - size)
        yield sample[start : start + size]


def in_threads(
    encoder: Encoder,
    sample: list[str],
    size: int,
    threads: int,
    torch_threads: int,
    rounds: int = ROUNDS,
) -> dict[str, float]:
    """`threads` model threads of `torch_threads` each, side by side, `rounds` batches
    each: the forward's p50 and p99 (ms), the texts and batches per second of them all,
    and the process's CPU per batch (ms)."""
    times: list[float] = []

    def work(k: int) -> None:
        torch.set_num_threads(torch_threads)
        encoder.encode(sample[:size])  # this thread's OpenMP team, warmed
        for batch in batches(sample, size, k * 1000, rounds):
            started = time.perf_counter()
            encoder.encode(batch)
            times.append((time.perf_counter() - started) * 1000)

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    cpu, started = time.process_time(), time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    cpu, seconds = time.process_time() - cpu, time.perf_counter() - started
    times.sort()
    return {
        "p50": statistics.median(times),
        "p99": times[int(0.99 * len(times))],
        "texts_per_s": threads * rounds * size / seconds,
        "batches_per_s": threads * rounds / seconds,
        "cpu": 1000 * cpu / (threads * rounds),
    }


def main() -> None:
    sample = texts()
    encoder = Encoder(precision="bf16")
    encoder.encode(sample[:64])
    print(f"bf16, {CORES} cores, a model thread (not the main thread) per batch")
    for size in (1, 4, 8, 32):
        one = in_threads(encoder, sample, size, 1, CORES)
        every, one_rate = one["p50"], one["texts_per_s"]
        single = in_threads(encoder, sample, size, 1, 1)["p50"]
        side_rate = in_threads(encoder, sample, size, CORES, 1)["texts_per_s"]
        print(
            f"batch {size:2d}: forward {every:6.2f} ms on {CORES} torch threads, "
            f"{single:6.2f} ms on 1; texts/s: one batch at a time on every core "
            f"{one_rate:5.0f}, {CORES} batches side by side on a core each {side_rate:5.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
