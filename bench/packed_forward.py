"""The packed BERT forward (inference/packed.py) against transformers' own, in this
process, on a model thread of one torch thread (as the interactive worker runs its
batches): for batches of 1-32 new texts each time (every batch meets token counts it has
not met before, as a server's do), the median time per batch of each forward, interleaved
round by round so that the machine's drift falls on both alike; and each forward's
vectors against transformers' fp32 (lowest cosine).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/packed_forward.py [--precision bf16] \
        [--texts messages,peers] [--sizes 1,4,8,32] [--rounds 12]
"""

from __future__ import annotations

import argparse
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

from bench.latency import message_texts, peer_texts  # noqa: E402
from inference import Encoder  # noqa: E402

PER_ROUND = 8  # batches per forward per round


def on_model_thread(fn):  # noqa: ANN001, ANN201
    """Run `fn` on a thread of one torch thread, as a model thread of the worker does."""
    out: list = []

    def run() -> None:
        torch.set_num_threads(1)
        out.append(fn())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--texts", default="messages,peers")
    parser.add_argument("--sizes", default="1,4,8,32")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    sources = {"messages": message_texts, "peers": lambda: peer_texts(20000)}
    eager = Encoder(precision=args.precision, packed=False)
    packed = Encoder(precision=args.precision)
    if packed.packed is None:
        raise SystemExit("the packed forward does not apply here (see the log)")
    reference = Encoder(precision="fp32", packed=False)
    forwards = {"transformers": eager, "packed": packed}
    print(f"{args.precision}, one torch thread on a model thread; ms per batch (median)")
    for name in args.texts.split(","):
        texts = sources[name]()
        check = texts[:256]
        want = reference.encode(check)
        cosines = {
            k: torch.nn.functional.cosine_similarity(want, m.encode(check), dim=1).min().item()
            for k, m in forwards.items()
        }
        print(f"{name}: lowest cosine to transformers' fp32 over {len(check)} texts: "
              + ", ".join(f"{k} {v:.6f}" for k, v in cosines.items()))  # fmt: skip
        place = len(check)
        for size in [int(x) for x in args.sizes.split(",")]:
            times: dict[str, list[float]] = {k: [] for k in forwards}
            for n in range(args.rounds):
                order = list(forwards) if n % 2 == 0 else list(reversed(forwards))
                for k in order:
                    batches = []
                    for _ in range(PER_ROUND):
                        batches.append(
                            [f"{t} #{place}" for t in texts[place % len(texts) :][:size]]
                        )
                        place += size

                    def run(model=forwards[k], batches=batches) -> list[float]:
                        spent = []
                        for batch in batches:
                            started = time.perf_counter()
                            model.encode(batch)
                            spent.append(time.perf_counter() - started)
                        return spent

                    times[k] += on_model_thread(run)
            medians = {k: 1000 * statistics.median(v) for k, v in times.items()}
            ratio = medians["transformers"] / medians["packed"]
            print(f"  batch {size:2d}: transformers {medians['transformers']:7.2f} ms, "
                  f"packed {medians['packed']:7.2f} ms: {ratio:.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
