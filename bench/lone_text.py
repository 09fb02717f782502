"""One text alone: ONNX Runtime's session (inference/lone.py) against torch's packed forward,
in this process (issue 19).

An interactive worker gives a batch alone in the process every core, and runs a batch of
one text there on ONNX Runtime (LANEWAY_LONE_RUNTIME=auto). This times the same encoder's
two forwards, interleaved text by text, on every core (or --threads), for single sample
messages and package summaries, and, for the record, batches of 2 to 8 texts (which stay
with torch: ONNX Runtime pads them); it prints the median ms per batch, the ratio, and the lowest
cosine of each to the model's own fp32 vectors (transformers' forward).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/lone_text.py [--precision auto] [--threads N]
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# model_threads sets the workers' OpenMP settings before torch loads, as they run.
from latency import peer_texts  # noqa: E402
from model_threads import texts as messages  # noqa: E402

from inference import Encoder  # noqa: E402
from inference.lone import LoneText  # noqa: E402
from inference.precision import choose  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as the interactive worker runs
ROUNDS = {1: 200, 2: 100, 3: 60, 4: 50, 8: 30}


def main() -> None:
    import torch
    import torch.nn.functional as F

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="auto", help="torch's side (auto: as workers)")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch's and the session's (0: every core)"
    )
    args = parser.parse_args()
    cores = args.threads or os.cpu_count() or 1
    precision = choose(args.precision, "cpu").precision
    torch.set_num_threads(cores)
    encoder = Encoder(precision=precision)
    print(f"torch: {encoder.runtime}; ONNX Runtime: {encoder.run_lone_texts('auto', cores)}")
    lone = encoder.lone
    if lone is None:
        sys.exit("no ONNX Runtime session here (see above)")
    reference = Encoder(precision="fp32", packed=False)

    def run(session: LoneText | None, texts: list[str]) -> torch.Tensor:
        encoder.lone = session  # None: torch's forward for every batch
        if session is not None and len(texts) > 1:  # what a worker never does: for the record
            prepared = encoder.prepare(texts)
            (_, inputs), *_ = prepared.batches
            return F.normalize(session.mean_pooled(inputs), dim=1)
        return encoder.encode(texts)

    sets = {"messages": messages(), "summaries": peer_texts(4000)}
    for name, sample in sets.items():
        want = reference.encode(sample[:200])
        for label, session in (("torch", None), ("onnxruntime", lone)):
            got = torch.cat([run(session, [t]) for t in sample[:200]])
            low = F.cosine_similarity(want, got).min().item()
            print(f"{name}: {label} one text at a time, cosine to fp32 min {low:.7f}")
    print(f"| texts | batch | torch {precision} ms | onnxruntime fp32 ms | torch / onnxruntime |")
    print("|---|---|---|---|---|")
    for name, sample in sets.items():
        for texts in sample[:20]:
            run(None, [texts]), run(lone, [texts])  # noqa: B018 - warm both
        for size, rounds in ROUNDS.items():
            times: dict[str, list[float]] = {"torch": [], "ort": []}
            for n in range(rounds):
                start = (n * 97 * size) % (len(sample) - size)
                batch = sample[start : start + size]
                for key, session in (("torch", None), ("ort", lone)):
                    began = time.perf_counter()
                    run(session, batch)
                    times[key].append((time.perf_counter() - began) * 1000)
            a, b = statistics.median(times["torch"]), statistics.median(times["ort"])
            print(f"| {name} | {size} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
    encoder.lone = lone


if __name__ == "__main__":
    main()
