"""CPU pre-processing of raw text, shared by every model."""

from __future__ import annotations

import unicodedata

_ASCII_CONTROL = {i: " " for i in (*range(32), 127)}


def clean(text: str) -> str:
    """Unicode NFC, control characters to spaces, whitespace collapsed."""
    if text.isascii():
        # The common case, without a Python-level pass over every character; printable
        # ASCII (most texts) has no control character to replace.
        if not text.isprintable():
            text = text.translate(_ASCII_CONTROL)
    else:
        text = unicodedata.normalize("NFC", text)
        text = "".join(ch if unicodedata.category(ch)[0] != "C" else " " for ch in text)
    return " ".join(text.split())


def limit(text: str, max_chars: int) -> str:
    """Cut a text to max_chars at a word boundary where one is near (the model truncates
    tokens anyway; this bounds tokenization work on huge inputs)."""
    if len(text) <= max_chars:
        return text
    cut = text.rfind(" ", max_chars - 50, max_chars)
    return text[: cut if cut > 0 else max_chars]
