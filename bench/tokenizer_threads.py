"""The tokenizer's thread pool inside the interactive worker, in this process (issue 19).

The interactive worker runs one model thread per core, each tokenizing and running a batch
of a few texts at a time. A fast tokenizer spreads each batch over every core on its own
Rust thread pool (TOKENIZERS_PARALLELISM, on by default), which takes the core of the other
model thread. This runs two model threads side by side, a torch thread each, as the worker
does, on batches of 1, 3 and 8 texts (the sample messages and the peers' summaries), with
the pool on and off alternated in the same process (the library reads the variable on every
call), and prints for each: batches per second, each batch's p50 / p99 (ms), the process's
CPU per batch, and off against on.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/tokenizer_threads.py
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
from laneway.yielding import openmp_env  # noqa: E402

os.environ.update(openmp_env())  # as the workers run: libgomp reads it when torch loads
import torch  # noqa: E402

from inference import Encoder  # noqa: E402

THREADS = os.cpu_count() or 1  # the worker's default: a model thread per core
BATCHES = 250  # per model thread and round
ROUNDS = 3  # each setting, alternated


def messages() -> list[str]:
    with open("examples/customer_messages.csv", newline="") as f:
        rows = [row[1] for row in csv.reader(f)][1:]
    return [f"{t} #{i}" for i, t in enumerate((rows * 20)[:4000])]


def summaries() -> list[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from latency import peer_texts

    return peer_texts(4000)


def side_by_side(encoder: Encoder, sample: list[str], size: int, pool: bool) -> dict:
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if pool else "false"
    times: list[float] = []

    def work(k: int) -> None:
        torch.set_num_threads(1)
        for n in range(BATCHES):
            start = (k * 1999 + n * size) % (len(sample) - size)
            started = time.perf_counter()
            encoder.encode(sample[start : start + size])
            times.append((time.perf_counter() - started) * 1000)

    workers = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    cpu, wall = time.process_time(), time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    times.sort()
    return {
        "rate": len(times) / wall,
        "p50": statistics.median(times),
        "p99": times[int(0.99 * len(times))],
        "cpu": 1000 * cpu / len(times),
    }


def main() -> None:
    encoder = Encoder(precision="bf16")
    print(f"bf16, {THREADS} model threads side by side, a torch thread each")
    for name, sample in (("messages", messages()), ("summaries", summaries())):
        encoder.encode(sample[:64])
        for size in (1, 3, 8):
            runs: dict[bool, list[dict]] = {True: [], False: []}
            for _ in range(ROUNDS):
                for pool in (True, False):
                    runs[pool].append(side_by_side(encoder, sample, size, pool))
            med = {
                pool: {k: statistics.median(r[k] for r in found) for k in found[0]}
                for pool, found in runs.items()
            }
            on, off = med[True], med[False]
            print(
                f"{name} batch {size}: pool on {on['rate']:.0f} batches/s, p50/p99 "
                f"{on['p50']:.2f}/{on['p99']:.2f} ms, CPU {on['cpu']:.2f} ms/batch; off "
                f"{off['rate']:.0f}, {off['p50']:.2f}/{off['p99']:.2f}, {off['cpu']:.2f}; "
                f"off/on: batches/s {off['rate'] / on['rate']:.2f}x, p99 "
                f"{off['p99'] / on['p99']:.2f}x, CPU {off['cpu'] / on['cpu']:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
