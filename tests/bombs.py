"""Hostile input: small gzip files that inflate to a great deal of nothing, gzip files that
are nested, truncated or followed by garbage, and a pipe where a file is expected."""

from __future__ import annotations

import gzip
import os
import signal
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

MIB = 1 << 20
# What a gzip file may inflate to here: hundreds of MiB from ~200 KiB (deflate's best ratio
# is about 1000:1), far past every limit a test sets.
BOMB_BYTES = 200 * MIB


@cache
def inflating(block: bytes, total: int = BOMB_BYTES, head: bytes = b"") -> bytes:
    """A gzip file of `head` then `block` repeated to `total` bytes, compressed a MiB at a
    time (never held inflated)."""
    out = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    piece = block * max(1, MIB // len(block))
    parts = [out.compress(head)]
    parts += [out.compress(piece) for _ in range(total // len(piece))]
    return b"".join([*parts, out.flush()])


# A header where a format needs one, then nothing: newlines, spaces on their lines,
# whitespace of every kind, one endless line of spaces.
NOTHING = {
    "newlines.csv.gz": (b"\n", b"id,text\n1,hello\n"),
    "newlines.jsonl.gz": (b"\n", b'{"id": "1", "text": "hello"}\n'),
    "spaced-lines.jsonl.gz": (b" " * 200 + b"\n", b""),
    "whitespace.csv.gz": (b" \t\r\n", b"id,text\n"),
    "empty-cells.csv.gz": (b",\n", b"id,text\n"),
    "one-endless-line.jsonl.gz": (b" ", b""),
}


def nothing(name: str) -> bytes:
    block, head = NOTHING[name]
    return inflating(block, BOMB_BYTES, head)


def nested(data: bytes) -> bytes:
    return gzip.compress(gzip.compress(data))


def with_trailing_garbage(data: bytes) -> bytes:
    return gzip.compress(data) + b"not gzip at all, after the end of the stream"


def truncated(data: bytes) -> bytes:
    packed = gzip.compress(data)
    return packed[: len(packed) // 2]


def stable_id(value: object) -> str | None:
    """A parametrized test's id part for a value: "data" for bytes, whose gzip headers carry
    the time they were made, so that every pytest-xdist worker collects the same ids."""
    return "data" if isinstance(value, bytes) else None


def planted_fifo(folder: Path) -> tuple[Path, Path]:
    """A FIFO named as an input file, and a link to it, both made in `folder` (the test's
    own): opened for reading, the FIFO waits for a writer that never comes."""
    fifo, link = folder / "items.csv", folder / "link.csv"
    os.mkfifo(fifo)
    link.symlink_to(fifo)
    return fifo, link


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fail the block with TimeoutError after `seconds` (SIGALRM; the main thread only): code
    that opens a planted FIFO when it should refuse it fails the test instead of hanging it."""

    def expired(*_: object) -> None:
        raise TimeoutError(f"still running after {seconds} s: a FIFO was opened?")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
