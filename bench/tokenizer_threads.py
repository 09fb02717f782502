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

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# model_threads sets the workers' OpenMP settings before torch loads, as they run.
from latency import peer_texts  # noqa: E402
from model_threads import in_threads  # noqa: E402
from model_threads import texts as messages  # noqa: E402

from inference import Encoder  # noqa: E402

THREADS = os.cpu_count() or 1  # the worker's default: a model thread per core
BATCHES = 250  # per model thread and round
ROUNDS = 3  # each setting, alternated


def side_by_side(encoder: Encoder, sample: list[str], size: int, pool: bool) -> dict:
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if pool else "false"
    return in_threads(encoder, sample, size, THREADS, 1, rounds=BATCHES)


def main() -> None:
    encoder = Encoder(precision="bf16")
    print(f"bf16, {THREADS} model threads side by side, a torch thread each")
    for name, sample in (("messages", messages()), ("summaries", peer_texts(4000))):
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
                f"{name} batch {size}: pool on {on['batches_per_s']:.0f} batches/s, p50/p99 "
                f"{on['p50']:.2f}/{on['p99']:.2f} ms, CPU {on['cpu']:.2f} ms/batch; off "
                f"{off['batches_per_s']:.0f}, {off['p50']:.2f}/{off['p99']:.2f}, {off['cpu']:.2f}; "
                f"off/on: batches/s {off['batches_per_s'] / on['batches_per_s']:.2f}x, p99 "
                f"{off['p99'] / on['p99']:.2f}x, CPU {off['cpu'] / on['cpu']:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
