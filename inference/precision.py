"""The number format a model runs in on its device, and the start-up check of a reduced one.

`choose` picks it (LANEWAY_PRECISION, default auto): fp16 on CUDA, bf16 on a CPU that
computes bf16 natively, fp32 elsewhere. `load_checked` loads a reduced-precision model only
after it agreed with an fp32 copy on a small packaged sample (TOLERANCE); otherwise the
worker runs in fp32 and its log says why.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = ("auto", *DTYPES)
# Capabilities (torch.cpu.get_capabilities) that mean bf16 matrix products in hardware:
# Intel AMX and AVX512-BF16 (also AMD Zen 4+), Arm's BF16 and SVE-BF16 extensions.
BF16_CAPABILITIES = ("amx_bf16", "avx512_bf16", "bf16", "sve_bf16")


def native_bf16_cpu() -> bool:
    """Whether this CPU computes bf16 natively, as torch's cpuinfo sees it.

    torch.cpu.get_capabilities() is public (torch >= 2.8); oneDNN's own
    `_is_mkldnn_bf16_supported` is not used: it says yes on any AVX512 CPU, where bf16 is
    emulated and slower than fp32.
    """
    if not torch.backends.mkldnn.is_available():
        return False
    caps = torch.cpu.get_capabilities()
    return any(bool(caps.get(name, False)) for name in BF16_CAPABILITIES)


def runs_natively(precision: str, device_type: str) -> bool:
    """Whether `device_type` computes `precision` in hardware (fp32 always does)."""
    if precision == "fp32":
        return True
    if device_type == "cuda":
        return precision == "fp16" or torch.cuda.is_bf16_supported()
    return precision == "bf16" and native_bf16_cpu()


@dataclass(frozen=True)
class Choice:
    """The precision a worker loads, and why it is not the one asked for ("" when it is)."""

    precision: str
    fallback: str = ""


def choose(setting: str, device_type: str, cuda_half: bool = True) -> Choice:
    """auto: fp16 on CUDA (fp32 where the deprecated LANEWAY_CUDA_HALF=false), bf16 on a
    CPU with native bf16, else fp32. An explicit precision the device does not compute
    natively falls back to fp32, with the reason: a fleet-wide LANEWAY_PRECISION=fp16 meant
    for GPU workers must not stop (or crawl on) a CPU worker."""
    if setting not in PRECISIONS:
        raise ValueError(f"unknown precision {setting!r}: expected one of {', '.join(PRECISIONS)}")
    if setting == "auto":
        if device_type == "cuda":
            return Choice("fp16" if cuda_half else "fp32")
        return Choice("bf16" if native_bf16_cpu() else "fp32")
    if runs_natively(setting, device_type):
        return Choice(setting)
    return Choice("fp32", f"{setting} is not computed natively on {device_type}")


def runtime_label(precision: str, device_type: str) -> str:
    """What a chunk ran on, e.g. 'torch 2.13.0 bf16 cpu'."""
    return f"torch {torch.__version__.split('+')[0]} {precision} {device_type}"


@dataclass(frozen=True)
class Tolerance:
    """How far a reduced precision may stray from fp32 on the sample."""

    cosine: float = 0.999  # every embedding's cosine to its fp32 twin, at least
    labels: float = 0.99  # share of labels (zero-shot, classes, token tags) unchanged
    rating: float = 0.02  # largest change of a rating or a probability


TOLERANCE = Tolerance()


@dataclass(frozen=True)
class Sample:
    texts: list[str]
    labels: list[str]  # the zero-shot label set, in first-seen order


def load_sample() -> Sample:
    """The packaged sample (inference/data/precision_sample.jsonl): texts and their labels."""
    raw = resources.files("inference").joinpath("data/precision_sample.jsonl").read_text("utf-8")
    rows = [json.loads(line) for line in raw.splitlines() if line.strip()]
    labels = list(dict.fromkeys(row["label"] for row in rows))
    return Sample([row["text"] for row in rows], labels)


def outputs(model: Any, sample: Sample, anchors: Sequence[str]) -> dict[str, torch.Tensor]:
    """What the check compares, per model kind, as float32 tensors.

    Encoder: embeddings, zero-shot labels over the sample's labels, anchor ratings.
    SequenceClassifier: top labels, and ratings where its labels define one (else the
    probabilities). TokenClassifier: each real token's tag and its probability.
    """
    from inference.encoder import Encoder
    from inference.ner import TokenClassifier
    from inference.pipeline import LABEL_TEMPLATE, anchor_ratings
    from inference.seqcls import SequenceClassifier, rating_weights

    with torch.inference_mode():
        if isinstance(model, Encoder):
            vectors = model.encode(sample.texts)
            label_vectors = model.encode_fixed([LABEL_TEMPLATE.format(x) for x in sample.labels])
            ratings = anchor_ratings(vectors, model.encode_fixed(list(anchors)))
            return {
                "vectors": vectors,
                "labels": (vectors @ label_vectors.T).argmax(dim=1),
                "ratings": torch.tensor(ratings),
            }
        if isinstance(model, SequenceClassifier):
            probs = model.predict(sample.texts)
            try:
                rating_weights(model.labels)
                graded = {"ratings": torch.tensor(model.rating_outputs(probs))}
            except ValueError:
                graded = {"probabilities": probs}
            return {"labels": probs.argmax(dim=1), **graded}
        if isinstance(model, TokenClassifier):
            prepared = model.prepare(sample.texts)
            tags, probs = [], []
            for (_, enc), batch in zip(prepared.batches, model.forward(prepared), strict=True):
                real = enc["attention_mask"].bool()
                best, tag = batch.max(dim=-1)
                tags.append(tag[real])
                probs.append(best[real])
            return {"labels": torch.cat(tags), "probabilities": torch.cat(probs)}
    raise TypeError(f"no precision check for {type(model).__name__}")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    measures: dict[str, float]
    failures: list[str]


def compare(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor], tol: Tolerance) -> Verdict:
    """The reduced model's outputs against fp32's, measured and judged by `tol`."""
    measures: dict[str, float] = {}
    failures: list[str] = []
    if "vectors" in want:
        a, b = want["vectors"].float(), got["vectors"].float()
        cosine = torch.nn.functional.cosine_similarity(a, b, dim=1).min().item()
        measures["cosine_min"] = round(cosine, 6)
        if cosine < tol.cosine:
            failures.append(f"embedding cosine {cosine:.6f} < {tol.cosine}")
    same = (want["labels"] == got["labels"]).float().mean().item() if len(want["labels"]) else 1.0
    measures["labels_unchanged"] = round(same, 4)
    if same < tol.labels:
        failures.append(f"labels unchanged {same:.4f} < {tol.labels}")
    for key in ("ratings", "probabilities"):
        if key in want:
            diff = (want[key].float() - got[key].float()).abs().max().item()
            measures[f"{key}_max_diff"] = round(diff, 6)
            if diff > tol.rating:
                failures.append(f"{key} differ by {diff:.6f} > {tol.rating}")
    return Verdict(not failures, measures, failures)


def load_checked(
    build: Callable[[str], Any],
    precision: str,
    anchors: Sequence[str],
    name: str = "model",
    tolerance: Tolerance = TOLERANCE,
) -> Any:
    """`build(precision)` if it agrees with `build("fp32")` on the packaged sample, else the
    fp32 model, with a WARNING saying why. The fp32 copy is dropped once compared, except
    by an Encoder, which keeps it for its fixed texts (Encoder.fixed_encoder)."""
    if precision == "fp32":
        return build("fp32")
    started = time.perf_counter()
    sample = load_sample()
    reference = build("fp32")
    want = outputs(reference, sample, anchors)
    reduced = build(precision)
    if hasattr(reduced, "fixed_encoder"):
        reduced.fixed_encoder = reference
    verdict = compare(want, outputs(reduced, sample, anchors), tolerance)
    seconds = time.perf_counter() - started
    if verdict.ok:
        log.info(
            "%s: %s passed the precision check against fp32 on %s texts in %.2f s: %s",
            name, precision, len(sample.texts), seconds, verdict.measures,
        )  # fmt: skip
        return reduced
    log.warning(
        "%s: %s failed the precision check against fp32 (%s; %s); running in fp32 instead",
        name, precision, "; ".join(verdict.failures), verdict.measures,
    )  # fmt: skip
    return reference
