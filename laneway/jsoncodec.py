"""Compact JSON text for what Laneway stores (result rows, cache entries), with orjson.

A chunk's 256 embeddings are ~100,000 floats: the stdlib encoder spent ~17 ms of a
worker's CPU per chunk on them, orjson ~2 ms (docs/benchmarks.md). The text differs only
in form (`1e-06` becomes `1e-6`, non-ASCII stays unescaped); it parses to the same
values. What orjson refuses (an integer past 64 bits) falls back to the stdlib, so
nothing that stored before fails now.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def dumps(obj: Any) -> str:
    """`obj` as compact JSON text."""
    try:
        return orjson.dumps(obj, option=_OPTIONS).decode()
    except TypeError:
        return json.dumps(obj, separators=(",", ":"))
