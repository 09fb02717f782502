"""Zero-shot categorization: cosine similarity of each text to each label's embedding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inference.encoder import Encoder, clean

LABEL_TEMPLATE = "This message is about {}."


class ZeroShotClassifier:
    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self._label_cache: dict[tuple[str, ...], Any] = {}

    def _label_matrix(self, labels: Sequence[str]):  # noqa: ANN202
        key = tuple(labels)
        if key not in self._label_cache:
            self._label_cache[key] = self.encoder.encode([LABEL_TEMPLATE.format(x) for x in key])
        return self._label_cache[key]

    def classify(self, texts: Sequence[str], labels: Sequence[str]) -> list[dict[str, Any]]:
        """One result per text: the best label, its score, and every label's score."""
        vectors = self.encoder.encode([clean(t) for t in texts])
        sims = vectors @ self._label_matrix(labels).T
        results = []
        for row in sims.tolist():
            scores = {label: round(s, 6) for label, s in zip(labels, row, strict=True)}
            best = max(range(len(labels)), key=row.__getitem__)
            results.append({"label": labels[best], "score": round(row[best], 6), "scores": scores})
        return results
