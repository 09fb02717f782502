"""The start-up check of a reduced precision (inference/precision.py chooses it).

`load_checked` loads a reduced-precision model only after it agreed with an fp32 copy on a
small packaged sample (TOLERANCE); otherwise the worker runs in fp32 and its log says why.

The check costs two forwards over the sample besides the loads, on every worker start. Its
verdict depends only on the model's files, the precision, the device, the software and the
sample, so `Verdicts` keeps it in a folder (LANEWAY_MODEL_CACHE_DIR/precision-checks): a
worker that starts again on the same machine with the same model files reads it instead of
repeating the check (what a restart or a scale-up from zero waits for), and any change of
those inputs makes another key, checked anew.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

import torch

from inference.encoder import Encoder
from inference.kept import KeptFiles, model_key
from inference.ner import TokenClassifier
from inference.pipeline import LABEL_TEMPLATE, anchor_ratings
from inference.seqcls import SequenceClassifier, rating_weights

log = logging.getLogger(__name__)


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


def _sample_text() -> str:
    return resources.files("inference").joinpath("data/precision_sample.jsonl").read_text("utf-8")


def load_sample() -> Sample:
    """The packaged sample (inference/data/precision_sample.jsonl): texts and their labels."""
    raw = _sample_text()
    rows = [json.loads(line) for line in raw.splitlines() if line.strip()]
    labels = list(dict.fromkeys(row["label"] for row in rows))
    return Sample([row["text"] for row in rows], labels)


def outputs(model: Any, sample: Sample, anchors: Sequence[str]) -> dict[str, torch.Tensor]:
    """What the check compares, per model kind, as float32 tensors.

    Encoder: embeddings, zero-shot labels over the sample's labels, anchor ratings.
    SequenceClassifier: top labels, and ratings where its labels define one (else the
    probabilities). TokenClassifier: each real token's tag and its probability.
    """
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


def device_identity(device: str) -> dict[str, Any]:
    """What a device computes with, as far as a precision's arithmetic goes: a CPU's
    instruction sets (torch's cpuinfo), a GPU's name and compute capability."""
    kind = torch.device(device).type
    if kind == "cuda":
        index = torch.device(device).index or 0
        return {
            "cuda": torch.cuda.get_device_name(index),
            "capability": list(torch.cuda.get_device_capability(index)),
        }
    return {"cpu": {k: v for k, v in sorted(torch.cpu.get_capabilities().items()) if v}}


class Verdicts(KeptFiles):
    """The check's verdicts, one small JSON file each in `folder` (inference/kept.py)."""

    suffix = ".json"
    what = "precision verdict"

    @staticmethod
    def key(model_path: str, precision: str, device: str, anchors: Sequence[str],
            tolerance: Tolerance, **settings: Any) -> str:  # fmt: skip
        return model_key(
            model_path,
            precision=precision,
            device=device_identity(device),
            sample=hashlib.sha256(_sample_text().encode()).hexdigest(),
            anchors=list(anchors),
            tolerance=asdict(tolerance),
            settings=settings,
        )

    def get(self, key: str) -> Verdict | None:
        try:
            raw = json.loads(self.read(key) or b"")
            return Verdict(bool(raw["ok"]), dict(raw["measures"]), list(raw["failures"]))
        except (ValueError, KeyError, TypeError):
            return None  # none kept, or unreadable: the check runs

    def put(self, key: str, verdict: Verdict) -> None:
        self.write(key, json.dumps(asdict(verdict)).encode())


def load_checked(
    build: Callable[[str], Any],
    precision: str,
    anchors: Sequence[str],
    name: str = "model",
    tolerance: Tolerance = TOLERANCE,
    verdicts: Verdicts | None = None,
    key: str = "",
) -> Any:
    """`build(precision)` if it agrees with `build("fp32")` on the packaged sample, else the
    fp32 model, with a WARNING saying why. The fp32 copy is dropped once compared, except
    by an Encoder, which keeps it for its fixed texts (Encoder.fixed_encoder). With
    `verdicts` and a `key` (Verdicts.key), a verdict kept there is used instead of the
    check, and a new one is kept."""
    if precision == "fp32":
        return build("fp32")
    known = verdicts.get(key) if verdicts is not None and key else None
    if known is not None:
        return _as_known(build, precision, name, known, verdicts)
    started = time.perf_counter()
    sample = load_sample()
    reference = build("fp32")
    want = outputs(reference, sample, anchors)
    reduced = build(precision)
    if hasattr(reduced, "fixed_encoder"):
        reduced.fixed_encoder = reference
    verdict = compare(want, outputs(reduced, sample, anchors), tolerance)
    seconds = time.perf_counter() - started
    if verdicts is not None and key:
        verdicts.put(key, verdict)
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


def _as_known(build: Callable[[str], Any], precision: str, name: str, known: Verdict,
              verdicts: Verdicts) -> Any:  # fmt: skip
    """The model as a kept verdict has it: the reduced one (with its fp32 twin for an
    Encoder's fixed texts), or fp32 with the same WARNING as the check's."""
    if not known.ok:
        log.warning(
            "%s: %s failed the precision check against fp32 (%s; %s, kept in %s); running "
            "in fp32 instead",
            name, precision, "; ".join(known.failures), known.measures, verdicts.folder,
        )  # fmt: skip
        return build("fp32")
    reduced = build(precision)
    if hasattr(reduced, "fixed_encoder"):
        reduced.fixed_encoder = build("fp32")
    log.info(
        "%s: %s passed the precision check against fp32 (kept in %s): %s",
        name, precision, verdicts.folder, known.measures,
    )  # fmt: skip
    return reduced
