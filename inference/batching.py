"""Tokenize once on CPU, sorted by length into micro-batches; run them on the device."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from inference.stages import Interrupted, stop_check
from inference.tokenize import Direct


@dataclass
class Prepared:
    """A chunk's texts tokenized into length-sorted micro-batches, ready for the device.

    `batches[k]` is (the input positions it holds, its tokenized tensors on CPU);
    `offsets[k]`, when asked for, is each text's (start, end) character span per token.
    """

    n: int
    batches: list[tuple[list[int], dict[str, torch.Tensor]]]
    offsets: list[list[list[tuple[int, int]]]] = field(default_factory=list)

    def __len__(self) -> int:
        return self.n


def prepare(
    tokenizer: Any,
    texts: Sequence[str],
    max_length: int,
    batch_size: int,
    offsets: bool = False,
    direct: Direct | None = None,
) -> Prepared:
    """Sort by length (so padding, and wasted compute, stays small) and tokenize: by
    `direct` (inference/tokenize.py) where given and no offsets are asked, else through
    transformers' call per micro-batch."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    if direct is not None and not offsets:
        return Prepared(n=len(texts), batches=direct.batches(texts, order, batch_size))
    out = Prepared(n=len(texts), batches=[])
    for begin in range(0, len(order), batch_size):
        idx = order[begin : begin + batch_size]
        enc = tokenizer(
            [texts[i] for i in idx],
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
            return_offsets_mapping=offsets,
        )
        if offsets:
            out.offsets.append(
                [[tuple(p) for p in row] for row in enc.pop("offset_mapping").tolist()]
            )
        out.batches.append((idx, dict(enc)))
    return out


def run_batches(
    prepared: Prepared,
    forward: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    device: torch.device,
) -> list[torch.Tensor]:
    """Run forward on each micro-batch on the device; results come back to CPU, per batch."""
    results = []
    stop = stop_check.get()
    with torch.inference_mode():
        for _, enc in prepared.batches:
            if stop is not None and stop():
                raise Interrupted("stopped between micro-batches")
            inputs = {k: v.to(device, non_blocking=True) for k, v in enc.items()}
            results.append(forward(inputs).float().cpu())
    return results


def scatter(prepared: Prepared, per_batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """Put per-batch rows back into input order: row i of the result is text i's."""
    first = per_batch[0]
    out = torch.empty((prepared.n, *first.shape[1:]), dtype=first.dtype)
    for (idx, _), rows in zip(prepared.batches, per_batch, strict=True):
        out[torch.tensor(idx)] = rows
    return out
