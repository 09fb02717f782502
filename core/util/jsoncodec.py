"""Compact JSON text for what Laneway stores (result rows, cache entries) and what the
interactive path carries (requests, answers, responses), with orjson.

A chunk's 256 embeddings are ~100,000 floats: the stdlib encoder spent ~17 ms of a
worker's CPU per chunk on them, orjson ~2 ms (docs/benchmarks.md). The text differs only
in form (`1e-06` becomes `1e-6`, non-ASCII stays unescaped); it parses to the same
values. What orjson refuses (an integer past 64 bits) falls back to the stdlib, so
nothing that stored before fails now. On the interactive path the stdlib's encoding and
decoding of each answer's floats (an embedding: 384) took a seventh of the web process's
CPU (docs/benchmarks.md, issue 19).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def dumps(obj: Any) -> str:
    """`obj` as compact JSON text."""
    return dumps_bytes(obj).decode()


def dumps_bytes(obj: Any) -> bytes:
    """`obj` as compact JSON, UTF-8 encoded."""
    try:
        return orjson.dumps(obj, option=_OPTIONS)
    except TypeError:
        return json.dumps(obj, separators=(",", ":")).encode()


def loads(data: bytes | str) -> Any:
    """A JSON document's value; what orjson refuses (NaN, which the stdlib writes) is read
    by the stdlib."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
