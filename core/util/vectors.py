"""An embedding as Laneway stores it: float32 bytes, not JSON text.

A chunk of 256 MiniLM embeddings is about 850 KB as JSON text: encoding it, parsing it
back and compressing it in Postgres cost the worker and the database more than the rest
of the chunk's write. As float32 (little-endian, 1,536 bytes for 384 dimensions) it is a
copy to write and stays under Postgres' 2 kB compression threshold.

The model's vectors reach clients rounded to 6 decimals (inference/pipeline.py rounds
them once, in float64). A float32 holds such a value of a unit vector exactly enough to
give it back: its error below 8 is under 2.4e-7, half of the last decimal's 5e-7, so
`unpack(pack(v))` equals `v`. Vectors with a component of 8 or more (never a unit vector)
are not packed: they stay JSON, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

DECIMALS = 6
FIELD = "embedding"  # the output field that holds a task's vector (embed's)
_EXACT_BELOW = 8.0
_F32 = np.dtype("<f4")


def pack(values: Sequence[float] | np.ndarray) -> bytes | None:
    """The vector as float32 bytes, or None where float32 would not give it back (a
    component of 8 or more or not finite, or not a flat vector of numbers)."""
    try:
        array = np.asarray(values)  # the pipeline's rows: no copy
    except (TypeError, ValueError):  # ragged
        return None
    if array.dtype.kind not in "fi" or array.ndim != 1:  # not a flat vector of numbers
        return None
    # One comparison refuses NaN, infinities and 8 or more.
    if array.size and not np.abs(array).max() < _EXACT_BELOW:
        return None
    return array.astype(_F32).tobytes()


def unpack(data: bytes) -> np.ndarray:
    """The vector `pack` stored, as float64 rounded to DECIMALS: the values it was given."""
    return np.round(np.frombuffer(data, dtype=_F32).astype(np.float64), DECIMALS)


def split(output: dict[str, Any] | None) -> tuple[dict[str, Any] | None, bytes | None]:
    """An output without its vector, and the vector packed; the output unchanged (and
    None) when it has no vector, or one `pack` refuses. The given dict is never changed:
    other threads may read it (the result cache's store)."""
    if not output or output.get(FIELD) is None:
        return output, None
    packed = pack(output[FIELD])
    if packed is None:
        return output, None
    return {k: v for k, v in output.items() if k != FIELD}, packed


def split_many(
    outputs: Sequence[dict[str, Any] | None],
) -> list[tuple[dict[str, Any] | None, bytes | None]]:
    """`split` of each output, the same pairs, a chunk's vectors packed together: the
    pipeline's vectors are float arrays of one length, and one stack, one check and one
    conversion for them all cost less than several numpy calls for each. Any other output
    (a list, another length, a vector `pack` refuses) goes through `split`."""
    pairs: list[tuple[dict[str, Any] | None, bytes | None] | None] = [None] * len(outputs)
    arrays = [
        (i, o[FIELD])
        for i, o in enumerate(outputs)
        if o and isinstance(o.get(FIELD), np.ndarray) and o[FIELD].dtype.kind == "f"
    ]
    shape = arrays[0][1].shape if arrays else ()
    alike = [(i, a) for i, a in arrays if a.shape == shape] if len(shape) == 1 and shape[0] else []
    if alike:
        stacked = np.stack([a for _, a in alike])
        exact = np.abs(stacked).max(axis=1) < _EXACT_BELOW  # NaN compares False: refused
        packed = stacked.astype(_F32)
        for row, (i, _) in enumerate(alike):
            output = outputs[i]
            if exact[row] and output is not None:
                pairs[i] = ({k: v for k, v in output.items() if k != FIELD}, packed[row].tobytes())
    return [pair if pair is not None else split(o) for pair, o in zip(pairs, outputs, strict=True)]


def join(output: dict[str, Any] | None, packed: bytes | None) -> dict[str, Any]:
    """The output `split` took apart, the vector as a list of floats (for JSON)."""
    out = dict(output or {})
    if packed is not None:
        out[FIELD] = unpack(packed).tolist()
    return out
