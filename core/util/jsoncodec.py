"""Compact JSON text for what Laneway stores (result rows, cache entries) and what the
interactive path carries (requests, answers, responses), with orjson.

A chunk's embeddings are about a hundred thousand floats, and every interactive answer
carries hundreds: orjson encodes and decodes them in a fraction of the stdlib's CPU. The
text differs only in form (`1e-06` becomes `1e-6`, non-ASCII stays unescaped); it parses to
the same values. What orjson refuses (an integer past 64 bits) falls back to the stdlib, so
nothing the stdlib could store fails here.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
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
        return json.dumps(obj, separators=(",", ":"), default=_plain).encode()


def _plain(obj: Any) -> Any:
    """numpy's arrays and numbers (an embedding's vector) as the stdlib can write them."""
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def loads(data: bytes | str) -> Any:
    """A JSON document's value; what orjson refuses (NaN, which the stdlib writes) is read
    by the stdlib."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
