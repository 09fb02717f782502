"""fp16 weights against fp32 on a CPU without native bf16, in this process (issue 19 part 3).

On such a CPU (AVX2), `LANEWAY_PRECISION=auto` loads fp16 weights with fp32 arithmetic
(inference/halfweights.py). This times the packed forward in fp32 and in fp16 weights,
interleaved batch by batch, on one torch thread (an interactive model thread) and on every
core (a batch worker), for batches of 1-32 sample messages and package summaries, and
prints the median ms per batch, the ratio, and the lowest cosine to fp32's vectors.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/half_weights.py
"""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# model_threads sets the workers' OpenMP settings before torch loads, as they run.
from latency import peer_texts  # noqa: E402
from model_threads import texts as messages  # noqa: E402

from inference import Encoder, halfweights  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as the interactive worker runs
ROUNDS = {1: 60, 3: 40, 8: 30, 32: 10}


def main() -> None:
    import torch
    import torch.nn.functional as F

    if not halfweights.available():
        sys.exit("this CPU runs no fp16-weight products (FBGEMM needs x86 with AVX2)")
    fp32, fp16 = Encoder(precision="fp32"), Encoder(precision="fp16")
    sets = {"messages": messages(), "summaries": peer_texts(4000)}
    for name, sample in sets.items():
        cos = F.cosine_similarity(fp32.encode(sample[:500]), fp16.encode(sample[:500]))
        print(f"{name}: cosine of fp16 weights' vectors to fp32's, min {cos.min():.7f}")
    print("| threads | texts | batch | fp32 ms | fp16 weights ms | fp32 / fp16 |")
    print("|---|---|---|---|---|---|")
    for threads in (1, os.cpu_count() or 1):
        torch.set_num_threads(threads)
        for name, sample in sets.items():
            fp32.encode(sample[:64])
            fp16.encode(sample[:64])
            for size, rounds in ROUNDS.items():
                times: dict[str, list[float]] = {"fp32": [], "fp16": []}
                for n in range(rounds):
                    start = (n * 97 * size) % (len(sample) - size)
                    batch = sample[start : start + size]
                    for key, encoder in (("fp32", fp32), ("fp16", fp16)):
                        began = time.perf_counter()
                        encoder.encode(batch)
                        times[key].append((time.perf_counter() - began) * 1000)
                a, b = statistics.median(times["fp32"]), statistics.median(times["fp16"])
                print(f"| {threads} | {name} | {size} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
