"""ONNX Runtime against torch for the packaged MiniLM: throughput and accuracy (issue 17).

Exports the model with its mean pooling in the graph (inference/lone.py's export, what
an interactive worker runs for a lone text), applies onnxruntime's transformer graph
optimizations (attention, LayerNorm and GELU fusion), quantizes the optimized graph to
int8 per channel (quantize_dynamic), and measures each variant against torch fp32 and
the bf16 Laneway loads on a CPU with native bf16:

- items/s over --items texts in length-sorted batches of --batch-size, --threads threads;
- on examples/labelled.jsonl (630 messages with their true category): the min and mean
  cosine of each embedding to torch fp32's, the share of zero-shot labels unchanged, the
  zero-shot accuracy against the true labels, and the largest change of an anchor rating.
  Label and anchor vectors come from torch fp32 for every variant, as a bf16 worker's do.

Usage:
  HF_HUB_OFFLINE=1 .venv/bin/python bench/onnx_eval.py [--items 4000] [--threads 2]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from core.config.settings import Settings
from inference import Encoder, lone
from inference.batching import scatter
from inference.pipeline import LABEL_TEMPLATE, anchor_ratings
from inference.precision import native_bf16_cpu

ROOT = Path(__file__).resolve().parents[1]
LABELLED = ROOT / "examples" / "labelled.jsonl"
MESSAGES = ROOT / "examples" / "customer_messages.csv"


def export(encoder: Encoder, folder: Path) -> dict[str, Path]:
    """fp32 export, its transformer-optimized graph, and that graph in int8 per channel."""
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    raw, fp32, int8 = folder / "model.onnx", folder / "model-opt.onnx", folder / "model-int8.onnx"
    # The graph an interactive worker runs for a lone text: the encoder and its mean
    # pooling (the normalization is ort_encoder's).
    raw.write_bytes(lone.export(encoder.model))
    config = encoder.model.config
    optimized = optimizer.optimize_model(
        str(raw),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
    )
    optimized.save_model_to_file(str(fp32))
    # The fused operators (com.microsoft domain) escape ONNX shape inference: their outputs
    # are float, as the quantizer is told.
    quantize_dynamic(
        str(fp32),
        str(int8),
        weight_type=QuantType.QInt8,
        per_channel=True,
        extra_options={"DefaultTensorType": TensorProto.FLOAT},
    )
    return {"ort fp32 (optimized)": fp32, "ort int8 per channel": int8}


def ort_encoder(path: Path, encoder: Encoder, threads: int) -> Callable[[list[str]], torch.Tensor]:
    """A function from texts to embeddings through an onnxruntime session on the CPU."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}

    def encode(texts: list[str]) -> torch.Tensor:
        prepared = encoder.prepare(texts)
        rows = []
        for _, enc in prepared.batches:
            feed = {k: v.numpy() for k, v in enc.items() if k in wanted}
            pooled = torch.from_numpy(session.run(None, feed)[0])
            rows.append(torch.nn.functional.normalize(pooled, p=2, dim=1))
        return scatter(prepared, rows)

    return encode


def texts_for_speed(n: int) -> list[str]:
    with open(MESSAGES, newline="", encoding="utf-8") as fh:
        pool = [row["text"] for row in csv.DictReader(fh)]
    return [pool[i % len(pool)] for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=4000, help="texts for the items/s")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--labelled", type=Path, default=LABELLED)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rows = [json.loads(line) for line in args.labelled.read_text("utf-8").splitlines() if line]
    texts, truth = [r["text"] for r in rows], [r["label"] for r in rows]
    labels = list(dict.fromkeys(truth))
    anchors = list(Settings().score_anchors)
    fp32 = Encoder(batch_size=args.batch_size)
    label_vectors = fp32.encode([LABEL_TEMPLATE.format(x) for x in labels])
    anchor_vectors = fp32.encode(anchors)

    variants: dict[str, Callable[[list[str]], torch.Tensor]] = {"torch fp32": fp32.encode}
    bf16 = Encoder(batch_size=args.batch_size, precision="bf16")
    variants["torch bf16 (Laneway: bf16 products, fp32 residual)"] = bf16.encode
    full = Encoder(batch_size=args.batch_size)
    full.model.to(torch.bfloat16)
    variants["torch bf16 (all weights bf16)"] = full.encode
    folder = Path(tempfile.mkdtemp(prefix="laneway-onnx-"))
    for name, path in export(fp32, folder).items():
        variants[name] = ort_encoder(path, fp32, args.threads)

    speed_texts = texts_for_speed(args.items)
    reference = fp32.encode(texts)
    want_labels = (reference @ label_vectors.T).argmax(dim=1)
    want_ratings = torch.tensor(anchor_ratings(reference, anchor_vectors))
    results = []
    for name, encode in variants.items():
        encode(speed_texts[:64])  # warm-up
        started = time.perf_counter()
        encode(speed_texts)
        rate = len(speed_texts) / (time.perf_counter() - started)
        vectors = encode(texts)
        cosine = torch.nn.functional.cosine_similarity(vectors, reference, dim=1)
        got = (vectors @ label_vectors.T).argmax(dim=1)
        ratings = torch.tensor(anchor_ratings(vectors, anchor_vectors))
        right = sum(labels[i] == t for i, t in zip(got.tolist(), truth, strict=True))
        results.append(
            {
                "variant": name,
                "items_per_s": round(rate, 1),
                "cosine_min": round(cosine.min().item(), 5),
                "cosine_mean": round(cosine.mean().item(), 6),
                "labels_unchanged": round((got == want_labels).float().mean().item(), 4),
                "accuracy": round(right / len(truth), 4),
                "rating_max_diff": round((ratings - want_ratings).abs().max().item(), 4),
            }
        )
        print(json.dumps(results[-1]), flush=True)
    print(
        f"\n{args.items} texts, {args.threads} threads, batch {args.batch_size}; accuracy on "
        f"{len(texts)} labelled texts; native bf16: {native_bf16_cpu()}\n"
    )
    print("| variant | items/s | cosine min | cosine mean | labels unchanged | accuracy "
          "| rating max diff |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for r in results:
        print(
            f"| {r['variant']} | {r['items_per_s']} | {r['cosine_min']} | {r['cosine_mean']} "
            f"| {r['labels_unchanged']} | {r['accuracy']} | {r['rating_max_diff']} |"
        )


if __name__ == "__main__":
    main()
