"""fp16 weights (used on CUDA) keep results within the stated tolerance of fp32.

This machine has no GPU, so the fp16 model runs on CPU: the same number format, other
kernels. The older, looser bound kept for fp16 (docs/journal/): every embedding within
cosine 0.999 of its fp32 twin, and the zero-shot label unchanged for at least 95 % of texts.
"""

import csv
from pathlib import Path

import pytest
import torch

from core.vocab import DEFAULT_LABELS
from inference.encoder import Encoder
from inference.pipeline import Pipeline

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "customer_messages.csv"


@pytest.fixture(scope="module")
def texts():
    with open(SAMPLE, newline="") as fh:
        return [row["text"] for row in csv.DictReader(fh)][:60]


@pytest.mark.slow
def test_fp16_embeddings_and_labels_match_fp32(texts):
    torch.set_num_threads(1)
    full = Encoder(precision="fp32")
    # fp16 throughout is transformers' forward: the packed one (inference/packed.py) shares
    # the fp32 model's weights and pools in fp32, and with fp16 weights it stops at the
    # first LayerNorm ("mixed dtype").
    half = Encoder(precision="fp32", packed=False)
    half.model.half()
    try:
        v32, v16 = full.encode(texts), half.encode(texts)
    except RuntimeError as exc:  # pragma: no cover - a CPU build without fp16 kernels
        if "not implemented for 'Half'" not in str(exc):
            raise  # anything else is a fault of the code under test, not of the build
        pytest.skip(f"fp16 kernels unavailable on this CPU build: {exc}")
    cosine = (v32 * v16).sum(dim=1)
    assert cosine.min().item() >= 0.999

    labels = list(DEFAULT_LABELS)
    out32, _ = Pipeline(lambda task: full).run(texts, ["classify", "score"], labels)
    out16, _ = Pipeline(lambda task: half).run(texts, ["classify", "score"], labels)
    same = sum(a["label"] == b["label"] for a, b in zip(out32, out16, strict=True))
    assert same / len(texts) >= 0.95
    assert max(abs(a["rating"] - b["rating"]) for a, b in zip(out32, out16, strict=True)) < 0.05
