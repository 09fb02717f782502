"""Single-text forwards against batched ones, fp32 and bf16, in this process (issue 19 part 3):
the interactive worker runs one text per forward when a request comes alone, and batches
of many under load. Prints each precision's per-forward latency and per-text batched cost.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/single_forward.py
"""

import csv
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["HF_HUB_OFFLINE"] = "1"
from workers.cores import openmp_env  # noqa: E402

# The OpenMP wait settings the workers run with; libgomp reads them when torch loads it.
os.environ.update(openmp_env())
import torch  # noqa: E402

from inference import Encoder  # noqa: E402


def main() -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    with open("examples/customer_messages.csv", newline="") as f:
        texts = [row[1] for row in csv.reader(f)][1:]
    texts = [f"{t} #{i}" for i, t in enumerate((texts * 10)[:2000])]
    for precision in ("fp32", "bf16"):
        encoder = Encoder(precision=precision)
        encoder.encode(texts[:64])
        latencies = []
        for text in texts[:300]:
            started = time.perf_counter()
            encoder.encode([text])
            latencies.append((time.perf_counter() - started) * 1000)
        latencies.sort()
        started = time.perf_counter()
        encoder.encode(texts[300:1900], batch_size=32)
        seconds = time.perf_counter() - started
        print(
            f"{precision}: one text per forward p50 {statistics.median(latencies):.2f} ms, "
            f"p99 {latencies[int(0.99 * len(latencies))]:.2f} ms; batched by 32: "
            f"{1000 * seconds / 1600:.2f} ms per text ({1600 / seconds:.0f} texts/s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
