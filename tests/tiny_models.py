"""Tiny random BERT models saved to disk, for tests: built locally, nothing is downloaded."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertTokenizerFast,
)

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [
    "the", "a", "an", "and", "or", "but", "is", "was", "it", "i", "we", "you", "my", "this",
    "that", "to", "of", "in", "at", "on", "with", "for", "from", "very", "not", "so",
    "food", "service", "movie", "order", "delivery", "staff", "price", "product", "refund",
    "great", "good", "bad", "terrible", "slow", "fast", "love", "hate", "loved", "awful",
    "john", "smith", "mary", "jones", "acme", "corp", "london", "paris", "new", "york",
    "works", "met", "visited", "lives", "bank", "google", "berlin",
    ".", ",", "!", "?", "'", "-",
]  # fmt: skip
PIECES = ["##s", "##son", "##ing", "##ed", "##er", "##ly", "##y", "##o", "##n", "##a"]
VOCAB = SPECIAL + WORDS + PIECES


def _tokenizer() -> BertTokenizerFast:
    vocab = {token: i for i, token in enumerate(VOCAB)}
    return BertTokenizerFast(vocab=vocab, do_lower_case=True, model_max_length=128)


def _config(labels: list[str]) -> BertConfig:
    return BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        # Wider than the default 0.02 so that different texts get visibly different outputs.
        initializer_range=0.1,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )


def _make(model_class: type, path: Path, labels: list[str], bias: list[float] | None) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    _tokenizer().save_pretrained(path)
    model = model_class(_config(labels)).eval()
    if bias is not None:
        # Zero weights and a fixed bias make every input's logits equal `bias`: known outputs.
        with torch.no_grad():
            model.classifier.weight.zero_()
            model.classifier.bias.copy_(torch.tensor(bias, dtype=torch.float32))
    model.save_pretrained(path)
    return path


def make_seqcls_model(path: Path, labels: list[str], bias: list[float] | None = None) -> Path:
    """A random 2-layer BertForSequenceClassification with `labels`, saved (with its tokenizer)."""
    return _make(BertForSequenceClassification, path, labels, bias)


def make_token_model(path: Path, labels: list[str], bias: list[float] | None = None) -> Path:
    """A random 2-layer BertForTokenClassification with `labels`, saved (with its tokenizer)."""
    return _make(BertForTokenClassification, path, labels, bias)
