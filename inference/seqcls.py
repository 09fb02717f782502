"""Sequence classification with a local fine-tuned model: label probabilities and ratings."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification

from inference.base import LabeledModel, config_labels  # noqa: F401 - re-exported
from inference.batching import Prepared, scatter

# A star label starts with its number ("1", "4 stars") or names stars ("Stars: 4").
_STAR_LABEL = re.compile(r"^\s*(\d+)(?!\d)|star", re.IGNORECASE)
_FIRST_INT = re.compile(r"\d+")


def rating_weights(labels: Sequence[str]) -> list[float]:
    """Per-label weights w such that a text's rating is sum(p_i * w_i), each w_i in [-1, 1].

    neg/pos labels: P(pos) - P(neg); star labels: expected stars mapped linearly onto [-1, 1];
    any two labels: P(label 1) - P(label 0). Anything else raises ValueError.
    """
    lowered = [label.lower() for label in labels]
    neg = [("neg" in x) for x in lowered]
    # "non-positive" style labels count as negative, never as both.
    pos = [("pos" in x) and not n for x, n in zip(lowered, neg, strict=True)]
    if any(neg) and any(pos):
        return [1.0 if p else -1.0 if n else 0.0 for p, n in zip(pos, neg, strict=True)]

    if len(labels) >= 2 and all(_STAR_LABEL.search(x) for x in labels):
        found = [_FIRST_INT.search(x) for x in labels]
        if all(found):
            stars = [int(m.group()) for m in found]  # type: ignore[union-attr]
            lo, hi = min(stars), max(stars)
            if len(set(stars)) == len(stars) and hi > lo:
                return [2.0 * (s - lo) / (hi - lo) - 1.0 for s in stars]

    if len(labels) == 2:
        return [-1.0, 1.0]
    raise ValueError(
        f"the model's labels {list(labels)} cannot be turned into a rating: expected labels "
        "containing 'neg' and 'pos', star labels such as '1 star'..'5 stars', or exactly 2 labels"
    )


class SequenceClassifier(LabeledModel):
    """Softmax label probabilities from a local AutoModelForSequenceClassification directory."""

    auto_class = AutoModelForSequenceClassification

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rating_weights: torch.Tensor | None = None

    def _forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        # Softmax in fp32: fp16 logits are fine, fp16 probabilities lose small classes.
        return torch.softmax(self.model(**inputs).logits.float(), dim=-1)

    def forward(self, prepared: Prepared) -> torch.Tensor:
        """Device stage: (n, num_labels) float32 CPU probabilities, in input order."""
        if prepared.n == 0:
            return torch.empty((0, self.num_labels))
        return scatter(prepared, self.run(prepared, self._forward))

    def predict(self, texts: Sequence[str]) -> torch.Tensor:
        return self.forward(self.prepare(texts))

    def classify_outputs(self, probs: torch.Tensor) -> list[dict[str, Any]]:
        """Per text: the best label, its probability, and every label's probability."""
        results = []
        for row in probs.tolist():
            best = max(range(len(row)), key=row.__getitem__)
            scores = {label: round(p, 6) for label, p in zip(self.labels, row, strict=True)}
            results.append(
                {"label": self.labels[best], "score": round(row[best], 6), "scores": scores}
            )
        return results

    def rating_outputs(self, probs: torch.Tensor) -> list[float]:
        """Per text a rating in [-1, 1] (see rating_weights); ValueError if labels allow none."""
        if self._rating_weights is None:
            self._rating_weights = torch.tensor(rating_weights(self.labels), dtype=torch.float64)
        ratings = probs.to(torch.float64) @ self._rating_weights
        return [round(min(1.0, max(-1.0, r)), 6) for r in ratings.tolist()]
