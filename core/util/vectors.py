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
    """`split` of each output, the same pairs, a chunk's vectors packed together.

    The pipeline's chunk is vectors of one length under every output: one array made of
    them all in one call, one check and one conversion, then each row's bytes cut from
    one buffer, cost a fraction of numpy calls per output. Any other chunk (an output
    without a vector, a failed item, vectors of several lengths or of no numbers) goes
    through `split` output by output, as does a row the check refuses (float32 of 8 or
    more, or not finite): `split` decides it exactly, on the values as given."""
    try:
        stacked = np.array([output[FIELD] for output in outputs])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):  # no vector, no output, several lengths
        stacked = None
    if (
        stacked is None
        or stacked.ndim != 2
        or stacked.dtype.kind not in "fi"
        or not stacked.shape[1]
    ):
        return [split(output) for output in outputs]
    with np.errstate(over="ignore"):  # a value past float32's range: inf, refused below
        packed = stacked.astype(_F32)
    exact = (np.abs(packed).max(axis=1) < _EXACT_BELOW).tolist()  # NaN compares False
    width = packed.shape[1] * packed.itemsize
    data = packed.tobytes()
    pairs: list[tuple[dict[str, Any] | None, bytes | None]] = []
    start = 0
    for output, fits in zip(outputs, exact, strict=True):
        if fits and output is not None:  # an output: it held a vector
            rest: dict[str, Any] = {}
            if len(output) > 1:  # not the pipeline's embed output, its vector alone
                rest = {k: v for k, v in output.items() if k != FIELD}
            pairs.append((rest, data[start : start + width]))
        else:
            pairs.append(split(output))
        start += width
    return pairs


def join(output: dict[str, Any] | None, packed: bytes | None) -> dict[str, Any]:
    """The output `split` took apart, the vector as a list of floats (for JSON)."""
    out = dict(output or {})
    if packed is not None:
        out[FIELD] = unpack(packed).tolist()
    return out
