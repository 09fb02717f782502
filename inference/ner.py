"""Named entities with a local token-classification model, aggregated from BIO tags."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoModelForTokenClassification

from inference.base import LabeledModel
from inference.batching import Prepared

# B-X / I-X, plus the BIOES and BILU spellings of "begins" and "continues".
_TAG = re.compile(r"^([BIESLU])[-_](.+)$")
_BEGIN = {"B", "S", "U"}


def split_tag(label: str) -> tuple[str | None, str | None]:
    """("B", "PER") for "B-PER", (None, "PER") for a bare "PER", (None, None) for "O"."""
    if label.upper() == "O":
        return None, None
    m = _TAG.match(label)
    if m:
        return m.group(1), m.group(2)
    return None, label


def aggregate(
    offsets: Sequence[tuple[int, int]],
    label_ids: Sequence[int],
    scores: Sequence[float],
    labels: Sequence[str],
    text: str,
) -> list[dict[str, Any]]:
    """Group one text's tagged tokens into entities with exact character spans (BIO rules)."""
    entities: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    prev_end: int | None = None

    def close() -> None:
        nonlocal current
        if current is not None:
            entities.append(_finish(current, text))
            current = None

    for (start, end), label_id, score in zip(offsets, label_ids, scores, strict=True):
        if start == end:  # special tokens and padding carry the empty span (0, 0)
            close()
            prev_end = None
            continue
        prefix, kind = split_tag(labels[label_id])
        if kind is None:
            close()
        else:
            same = current is not None and current["type"] == kind
            # A word piece glued to the previous token stays in its entity even when the
            # model tagged it B-: a word is never split into two entities.
            piece = prev_end is not None and start == prev_end
            if same and (prefix not in _BEGIN or piece):
                current["end"] = end  # type: ignore[index]
                current["scores"].append(score)  # type: ignore[index]
            else:
                close()
                current = {"type": kind, "start": start, "end": end, "scores": [score]}
        prev_end = end
    close()
    entities.sort(key=lambda e: (e["start"], e["end"]))
    return entities


def _finish(entity: dict[str, Any], text: str) -> dict[str, Any]:
    start, end = entity["start"], entity["end"]
    # Some tokenizers count a leading space into the token's span; keep it out of the entity.
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    scores = entity["scores"]
    return {
        "type": entity["type"],
        "text": text[start:end],
        "start": start,
        "end": end,
        "score": round(sum(scores) / len(scores), 4),
        "source": "model",
    }


class TokenClassifier(LabeledModel):
    """Per-token label probabilities from a local AutoModelForTokenClassification directory."""

    auto_class = AutoModelForTokenClassification
    offsets = True

    def _forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        # Softmax in fp32: fp16 probabilities lose small classes.
        return torch.softmax(self.model(**inputs).logits.float(), dim=-1)

    def forward(self, prepared: Prepared) -> list[torch.Tensor]:
        """Device stage: per micro-batch (batch, seq, num_labels) float32 CPU probabilities."""
        # Not scattered: each micro-batch is padded to its own sequence length.
        return self.run(prepared, self._forward)

    def entities(
        self,
        prepared: Prepared,
        per_batch_probs: Sequence[torch.Tensor],
        texts: Sequence[str],
    ) -> list[list[dict[str, Any]]]:
        """Per input text, in input order, its entities sorted by start."""
        if prepared.n and not prepared.offsets:
            raise ValueError("entities need character offsets: use TokenClassifier.prepare")
        out: list[list[dict[str, Any]]] = [[] for _ in range(prepared.n)]
        for (idx, _), offsets, probs in zip(
            prepared.batches, prepared.offsets, per_batch_probs, strict=True
        ):
            best, label_ids = probs.max(dim=-1)
            for row, i in enumerate(idx):
                out[i] = aggregate(
                    offsets[row], label_ids[row].tolist(), best[row].tolist(), self.labels, texts[i]
                )
        return out

    def extract(self, texts: Sequence[str]) -> list[list[dict[str, Any]]]:
        prepared = self.prepare(texts)
        return self.entities(prepared, self.forward(prepared), texts)
