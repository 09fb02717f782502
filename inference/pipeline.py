"""A chunk's three stages: CPU pre-processing, the model on its device, CPU post-processing.

`Pipeline.run` takes raw texts and the tasks a job asked for, and returns one output dict
per text (fields that never collide: classify `label`/`score`/`scores`, score `rating`,
extract `entities`, embed `embedding`) and the seconds each stage took.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from inference.encoder import Encoder
from inference.text import clean, limit

# Characters kept per text before tokenization: a bound on tokenizer work for huge inputs,
# well past what max_length tokens can hold (a token is rarely under 1 character).
CHARS_PER_TOKEN_BOUND = 10
LABEL_TEMPLATE = "This message is about {}."
ANCHOR_TEMPERATURE = 0.05


@dataclass
class StageTimes:
    pre: float = 0.0
    model: float = 0.0
    post: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"pre": self.pre, "model": self.model, "post": self.post}


def length_safe(text: str) -> str:
    """Control characters to spaces, keeping every character's offset (for entity spans)."""
    return "".join(" " if (ord(ch) < 32 or 127 <= ord(ch) < 160) else ch for ch in text)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Pipeline:
    """Runs the tasks of a job over a chunk's texts with the models `resolve` hands out.

    `resolve(task)` returns the loaded model serving that task: an Encoder (zero-shot
    classify and score, embed), a SequenceClassifier (classify, score), a TokenClassifier
    (extract), or None for extract by patterns alone.
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
            self._text_vectors[key] = encoder.encode(list(texts))
        return self._text_vectors[key]

    def run(
        self, texts: Sequence[str], tasks: Sequence[str], labels: Sequence[str] = ()
    ) -> tuple[list[dict[str, Any]], StageTimes]:
        from inference.ner import TokenClassifier
        from inference.patterns import extract_patterns
        from inference.seqcls import SequenceClassifier

        times = StageTimes()
        outputs: list[dict[str, Any]] = [{} for _ in texts]
        models = {task: self.resolve(task) for task in tasks}

        # --- pre-processing (CPU): clean, bound lengths, tokenize once per model ----------
        started = time.perf_counter()
        cleaned: list[str] | None = None
        safe: list[str] | None = None
        prepared: dict[int, Any] = {}
        for task, model in models.items():
            if model is None:
                continue
            bound = model.max_length * CHARS_PER_TOKEN_BOUND
            if task == "extract":
                # Entity offsets must point into the text as submitted: no reflowing here.
                safe = safe if safe is not None else [limit(length_safe(t), bound) for t in texts]
                source = safe
            else:
                if cleaned is None:
                    cleaned = [limit(clean(t), bound) for t in texts]
                source = cleaned
            if id(model) not in prepared:
                prepared[id(model)] = model.prepare(source)
        times.pre = time.perf_counter() - started

        # --- model stage (the lane's device) --------------------------------------------
        started = time.perf_counter()
        raw: dict[int, Any] = {}
        for model in {id(m): m for m in models.values() if m is not None}.values():
            raw[id(model)] = model.forward(prepared[id(model)])
            if isinstance(model, Encoder):
                if "classify" in models and models["classify"] is model:
                    self._fixed_vectors(model, tuple(LABEL_TEMPLATE.format(x) for x in labels))
                if "score" in models and models["score"] is model:
                    self._fixed_vectors(model, self.score_anchors)
            _sync(model.device)
        times.model = time.perf_counter() - started

        # --- post-processing (CPU) -------------------------------------------------------
        started = time.perf_counter()
        for task, model in models.items():
            if task == "classify":
                if isinstance(model, SequenceClassifier):
                    results = model.classify_outputs(raw[id(model)])
                else:
                    results = self._zero_shot(model, raw[id(model)], labels)
                for out, res in zip(outputs, results, strict=True):
                    out.update(res)
            elif task == "score":
                if isinstance(model, SequenceClassifier):
                    ratings = model.rating_outputs(raw[id(model)])
                else:
                    ratings = self._anchor_ratings(model, raw[id(model)])
                for out, rating in zip(outputs, ratings, strict=True):
                    out["rating"] = rating
            elif task == "extract":
                found: list[list[dict[str, Any]]] = [[] for _ in texts]
                if isinstance(model, TokenClassifier):
                    found = model.entities(prepared[id(model)], raw[id(model)], safe)
                for out, text, ents in zip(outputs, texts, found, strict=True):
                    out["entities"] = merge_entities(ents, extract_patterns(text))
            elif task == "embed":
                for out, row in zip(outputs, raw[id(model)].tolist(), strict=True):
                    out["embedding"] = [round(x, 6) for x in row]
        times.post = time.perf_counter() - started
        return outputs, times

    def _zero_shot(
        self, encoder: Encoder, vectors: torch.Tensor, labels: Sequence[str]
    ) -> list[dict[str, Any]]:
        label_vectors = self._fixed_vectors(
            encoder, tuple(LABEL_TEMPLATE.format(x) for x in labels)
        )
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

    def _anchor_ratings(self, encoder: Encoder, vectors: torch.Tensor) -> list[float]:
        # Softmax over the similarities to the positive and negative anchor: p(pos) - p(neg).
        anchors = self._fixed_vectors(encoder, self.score_anchors)
        probs = torch.softmax((vectors @ anchors.T) / ANCHOR_TEMPERATURE, dim=1)
        return [round(max(-1.0, min(1.0, p - n)), 6) for p, n in probs.tolist()]


def merge_entities(model: list[dict[str, Any]], patterns: list[dict[str, Any]]) -> list[dict]:
    """Model entities plus pattern entities that overlap none of them, sorted by offset."""
    spans = [(e["start"], e["end"]) for e in model]
    kept = [p for p in patterns if all(p["end"] <= s or p["start"] >= e for s, e in spans)]
    return sorted(model + kept, key=lambda e: (e["start"], e["end"]))
