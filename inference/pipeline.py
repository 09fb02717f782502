"""A chunk's three stages: CPU pre-processing, the model on its device, CPU post-processing.

`Pipeline.run` takes raw texts and the tasks a job asked for, and returns one output dict
per text (fields that never collide: classify `label`/`score`/`scores`, score `rating`,
extract `entities`, embed `embedding` and `tokens`) and the seconds each stage took.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from inference.batching import Prepared
from inference.encoder import Encoder
from inference.ner import TokenClassifier
from inference.patterns import extract_patterns
from inference.precision import runtime_label
from inference.seqcls import SequenceClassifier
from inference.stages import StageTimes
from inference.text import clean, limit

# Characters kept per text before tokenization: a bound on tokenizer work for huge inputs,
# well past what max_length tokens can hold (a token is rarely under 1 character).
CHARS_PER_TOKEN_BOUND = 10
LABEL_TEMPLATE = "This message is about {}."
ANCHOR_TEMPERATURE = 0.05


def length_safe(text: str) -> str:
    """Control characters to spaces, keeping every character's offset (for entity spans)."""
    return "".join(" " if (ord(ch) < 32 or 127 <= ord(ch) < 160) else ch for ch in text)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Staged:
    """What flows between the stages, keyed so that another process can resume it.

    `prepared` and `raw` are keyed by the first task (in the job's order) that uses each
    model, so two processes with the same registry agree on the keys. Only tensors, lists
    and numbers are inside: `to_bytes`/`from_bytes` round-trip it safely (weights_only).
    """

    tasks: list[str]
    prepared: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    # The micro-batches this process's model stage ran (not handed over: it is measured
    # where it runs).
    batches: list[int] = field(default_factory=list)

    def to_bytes(self, part: str) -> bytes:
        buf = io.BytesIO()
        if part == "prepared":
            data = {k: [p.n, p.batches, p.offsets] for k, p in self.prepared.items()}
        else:
            data = self.raw
        torch.save(data, buf)
        return buf.getvalue()

    def load(self, part: str, blob: bytes) -> None:
        data = torch.load(io.BytesIO(blob), weights_only=True)
        if part == "prepared":
            self.prepared = {
                k: Prepared(n, [(list(i), dict(e)) for i, e in batches], offsets)
                for k, (n, batches, offsets) in data.items()
            }
        else:
            self.raw = data


class Pipeline:
    """Runs the tasks of a job over a chunk's texts with the models `resolve` hands out.

    `resolve(task)` returns the loaded model serving that task: an Encoder (zero-shot
    classify and score, embed), a SequenceClassifier (classify, score), a TokenClassifier
    (extract), or None for extract by patterns alone. `pre`, `model` and `post` are the
    three stages; `run` does all three in one process and times them.
    """

    def __init__(
        self,
        resolve: Callable[[str], Any],
        score_anchors: tuple[str, str] = (
            "a positive, happy, satisfied message",
            "a negative, angry, disappointed complaint",
        ),
    ) -> None:
        self.resolve = resolve
        self.score_anchors = score_anchors
        self._text_vectors: dict[tuple[int, tuple[str, ...]], torch.Tensor] = {}

    def _fixed_vectors(self, encoder: Encoder, texts: tuple[str, ...]) -> torch.Tensor:
        # Label and anchor embeddings are computed once per process and reused.
        key = (id(encoder), texts)
        if key not in self._text_vectors:
            self._text_vectors[key] = encoder.encode_fixed(list(texts))
        return self._text_vectors[key]

    def _models(self, tasks: Sequence[str]) -> tuple[dict[str, Any], dict[str, str]]:
        """The model per task, and per task the key its model's data lives under."""
        models = {task: self.resolve(task) for task in tasks}
        keys: dict[str, str] = {}
        for task, model in models.items():
            if model is not None:
                keys[task] = next(t for t in tasks if models[t] is model)
        return models, keys

    def runtime(self, tasks: Sequence[str]) -> dict[str, str | None]:
        """The precision ("bf16", or "bf16+fp32" where models differ) and runtime of the
        models serving `tasks`; None for both when no model does (extract by patterns)."""
        loaded = [m for m in self._models(tasks)[0].values() if m is not None]
        if not loaded:
            return {"precision": None, "runtime": None}
        precision = "+".join(sorted({m.precision for m in loaded}))
        return {"precision": precision, "runtime": runtime_label(precision, loaded[0].device.type)}

    def resume(self, tasks: Sequence[str], **parts: bytes) -> Staged:
        """A chunk's stages as another process handed them over: each part (`prepared`,
        `raw`) as `Staged.to_bytes` wrote it."""
        staged = Staged(list(tasks))
        for part, blob in parts.items():
            staged.load(part, blob)
        return staged

    def pre(self, texts: Sequence[str], tasks: Sequence[str]) -> Staged:
        """CPU: clean, bound lengths, tokenize once per model."""
        models, keys = self._models(tasks)
        staged = Staged(list(tasks))
        cleaned: list[str] | None = None
        for task, model in models.items():
            if model is None or keys[task] in staged.prepared:
                continue
            bound = model.max_length * CHARS_PER_TOKEN_BOUND
            if task == "extract":
                # Entity offsets must point into the text as submitted: no reflowing here.
                source = [limit(length_safe(t), bound) for t in texts]
            else:
                if cleaned is None:
                    cleaned = [limit(clean(t), bound) for t in texts]
                source = cleaned
            staged.prepared[keys[task]] = model.prepare(source)
        return staged

    def model(self, staged: Staged, labels: Sequence[str] = ()) -> Staged:
        """The device: forward passes, plus the label and anchor embeddings post needs."""
        models, keys = self._models(staged.tasks)
        for task, model in models.items():
            if model is None:
                continue
            if keys[task] not in staged.raw:
                prepared = staged.prepared[keys[task]]
                staged.raw[keys[task]] = model.forward(prepared)
                staged.batches += [len(idx) for idx, _ in prepared.batches]
            if isinstance(model, Encoder) and task == "classify":
                fixed = tuple(LABEL_TEMPLATE.format(x) for x in labels)
                staged.raw["classify:labels"] = self._fixed_vectors(model, fixed)
            if isinstance(model, Encoder) and task == "score":
                staged.raw["score:anchors"] = self._fixed_vectors(model, self.score_anchors)
            _sync(model.device)
        return staged

    def post(
        self, staged: Staged, texts: Sequence[str], labels: Sequence[str] = ()
    ) -> list[dict[str, Any]]:
        """CPU: scores, ratings, entities, vectors, formatted per text."""
        models, keys = self._models(staged.tasks)
        outputs: list[dict[str, Any]] = [{} for _ in texts]
        for task, model in models.items():
            raw = staged.raw.get(keys.get(task, ""))
            if task == "classify":
                if isinstance(model, SequenceClassifier):
                    results = model.classify_outputs(raw)
                else:
                    results = zero_shot(raw, staged.raw["classify:labels"], labels)
                for out, res in zip(outputs, results, strict=True):
                    out.update(res)
            elif task == "score":
                if isinstance(model, SequenceClassifier):
                    ratings = model.rating_outputs(raw)
                else:
                    ratings = anchor_ratings(raw, staged.raw["score:anchors"])
                for out, rating in zip(outputs, ratings, strict=True):
                    out["rating"] = rating
            elif task == "extract":
                found: list[list[dict[str, Any]]] = [[] for _ in texts]
                if isinstance(model, TokenClassifier):
                    bound = model.max_length * CHARS_PER_TOKEN_BOUND
                    safe = [limit(length_safe(t), bound) for t in texts]
                    found = model.entities(staged.prepared[keys[task]], raw, safe)
                for out, text, ents in zip(outputs, texts, found, strict=True):
                    out["entities"] = merge_entities(ents, extract_patterns(text))
            elif task == "embed":
                counts = token_counts(staged.prepared[keys[task]])
                for out, row, n in zip(outputs, rounded_rows(raw), counts, strict=True):
                    # `tokens`: what the model read (special tokens included, past
                    # max_length cut off), for usage figures such as OpenAI's.
                    out["embedding"] = row
                    out["tokens"] = n
        return outputs

    def run(
        self,
        texts: Sequence[str],
        tasks: Sequence[str],
        labels: Sequence[str] = (),
        before_model: Callable[[Sequence[str]], None] | None = None,
    ) -> tuple[list[dict[str, Any]], StageTimes]:
        """All three stages in this process, timed; `before_model(texts)` runs between the
        first two (the task layer injects faults there)."""
        times = StageTimes()
        started = time.perf_counter()
        staged = self.pre(texts, tasks)
        times.pre = time.perf_counter() - started
        if before_model is not None:
            before_model(texts)
        started = time.perf_counter()
        self.model(staged, labels)
        times.model = time.perf_counter() - started
        times.batches = staged.batches
        started = time.perf_counter()
        outputs = self.post(staged, texts, labels)
        times.post = time.perf_counter() - started
        return outputs, times


def token_counts(prepared: Prepared) -> list[int]:
    """Per text, in input order, the tokens its micro-batch fed the model (padding aside)."""
    counts = [0] * prepared.n
    for idx, enc in prepared.batches:
        for i, n in zip(idx, enc["attention_mask"].sum(dim=1).tolist(), strict=True):
            counts[i] = int(n)
    return counts


def rounded_rows(vectors: torch.Tensor, decimals: int = 6) -> np.ndarray:
    """The rows rounded to `decimals`, as one float64 array whose rows are the outputs'
    vectors, in one tensor operation. Never Python floats: the result writes store them as
    float32 bytes and the JSON encoder (orjson) writes numpy arrays itself, and 384 Python
    floats per text cost a chunk more than its database write. For the model's float32
    values it equals `round(x, decimals)` exactly (x * 10**6 is exact in float64, and both
    round half to even)."""
    return torch.round(vectors.double(), decimals=decimals).numpy()


def zero_shot(
    vectors: torch.Tensor, label_vectors: torch.Tensor, labels: Sequence[str]
) -> list[dict[str, Any]]:
    """Cosine similarity of each text to each label; the best label and every score."""
    sims = (vectors @ label_vectors.T).tolist()
    results = []
    for row in sims:
        best = max(range(len(labels)), key=row.__getitem__)
        results.append(
            {
                "label": labels[best],
                "score": round(row[best], 6),
                "scores": {label: round(s, 6) for label, s in zip(labels, row, strict=True)},
            }
        )
    return results


def anchor_ratings(vectors: torch.Tensor, anchors: torch.Tensor) -> list[float]:
    """Softmax over the similarities to the positive and negative anchor: p(pos) - p(neg)."""
    probs = torch.softmax((vectors @ anchors.T) / ANCHOR_TEMPERATURE, dim=1)
    return [round(max(-1.0, min(1.0, p - n)), 6) for p, n in probs.tolist()]


def merge_entities(model: list[dict[str, Any]], patterns: list[dict[str, Any]]) -> list[dict]:
    """Model entities plus pattern entities that overlap none of them, sorted by offset."""
    spans = [(e["start"], e["end"]) for e in model]
    kept = [p for p in patterns if all(p["end"] <= s or p["start"] >= e for s, e in spans)]
    return sorted(model + kept, key=lambda e: (e["start"], e["end"]))
