"""What parsing a JSON body would cost in memory, known before it is parsed.

Python's json module builds an object per value: an empty list takes about 72 bytes, a
small dict about 200, a number 30-40, while each takes two or three bytes of JSON. So a body
within the upload limit, shaped as millions of tiny arrays or objects, would cost 25-35
times its size. `parse_cost` counts, outside strings, the marks that each start a value
(`[`, `,`), the colons that each add a key and the braces that each make a dict, and
prices them at the most CPython
allocates for each (docs/reliability.md), plus 2 bytes per byte of an ASCII body
for the decoded text and the strings' characters, 8 otherwise (text holding one emoji
takes 4 bytes a character, in the decoded body and again in its string).
The web app refuses a body whose cost is above MEMORY_MULTIPLE times its size plus
MEMORY_FLOOR (413), so parsing one never takes more than that.

The scan runs in numpy, in blocks of BLOCK bytes: a few MiB of memory whatever the body's
size or shape. Most bodies never need it: counted anywhere, strings included, their marks
already keep them within the budget (`quick_cost`).
"""

from __future__ import annotations

import numpy as np

MIB = 1 << 20
# Parsing a JSON body of N bytes may take at most MEMORY_MULTIPLE * N + MEMORY_FLOOR bytes.
MEMORY_MULTIPLE = 20
MEMORY_FLOOR = 64 * MIB
# Upper bounds of CPython 3.11's allocations (tracemalloc, per shape, docs/reliability.md).
PER_BYTE = 2  # an ASCII body's decoded text, its strings' characters
PER_BYTE_WIDE = 8  # the same for a body with any other character
PER_VALUE = 64  # a value begun by `[` or `,` (a list, a number, a string, a slot)
PER_KEY = 96  # a key, its value and its slot in a dict's table (old and new while it grows)
PER_DICT = 200  # a dict and its first keys' table
BLOCK = 256 * 1024

_QUOTE, _BACKSLASH, _BRACE = ord('"'), ord("\\"), ord("{")
_VALUE_MARKS = np.frombuffer(b"[,", dtype=np.uint8)
_COLON = ord(":")


def structure(data: bytes) -> tuple[int, int, int]:
    """How many braces, colons, and `[` or `,` stand outside strings in `data`."""
    buf = np.frombuffer(data, dtype=np.uint8)
    inside = 0  # 1 while the previous block ended inside a string
    run = 0  # backslashes that ended the previous block
    braces = colons = marks = 0
    for start in range(0, len(buf), BLOCK):
        b = buf[start : start + BLOCK]
        idx = np.arange(len(b), dtype=np.int64)
        # For each byte, the last byte at or before it that is not a backslash; the
        # previous block's trailing run counts as backslashes before this block.
        last = np.maximum.accumulate(np.where(b == _BACKSLASH, -1 - run, idx))
        before = np.empty_like(last)
        before[0], before[1:] = -1 - run, last[:-1]
        escaped = ((idx - 1 - before) & 1).astype(bool)  # after an odd run of backslashes
        quotes = (b == _QUOTE) & ~escaped
        parity = (inside + np.cumsum(quotes, dtype=np.int64)) & 1
        outside = parity == 0  # a quote's own parity does not matter: it is no mark
        braces += int(np.count_nonzero((b == _BRACE) & outside))
        colons += int(np.count_nonzero((b == _COLON) & outside))
        marks += int(np.count_nonzero(np.isin(b, _VALUE_MARKS) & outside))
        inside = int(parity[-1])
        run = int(len(b) - 1 - last[-1]) if b[-1] == _BACKSLASH else 0
    return braces, colons, marks


def parse_cost(data: bytes) -> int:
    """An upper bound, in bytes, of what json.loads(data) allocates."""
    return _cost(data, *structure(data))


def quick_cost(data: bytes) -> int:
    """parse_cost's bound with the marks counted inside strings too: never below it, and
    each count one pass in C (`bytes.count`), far quicker than the scan that tells
    strings apart. Text holds few such marks, so for most bodies it is close."""
    marks = data.count(b"[") + data.count(b",")
    return _cost(data, data.count(b"{"), data.count(b":"), marks)


def _cost(data: bytes, braces: int, colons: int, marks: int) -> int:
    per_byte = PER_BYTE if data.isascii() else PER_BYTE_WIDE
    return per_byte * len(data) + PER_VALUE * (marks + 1) + PER_KEY * colons + PER_DICT * braces


def budget(size: int) -> int:
    """The most that parsing a body of `size` bytes may take."""
    return MEMORY_MULTIPLE * size + MEMORY_FLOOR


def too_costly(data: bytes) -> str | None:
    """Why `data` would cost too much to parse, or None when it may be parsed."""
    most = PER_BYTE_WIDE * len(data) + max(PER_DICT, PER_KEY, PER_VALUE) * len(data) + PER_VALUE
    if budget(len(data)) >= most or quick_cost(data) <= budget(len(data)):
        return None  # no shape this small, or not this body's marks even in its strings
    cost = parse_cost(data)
    if cost <= budget(len(data)):
        return None
    return (
        f"the JSON body has too many values for its size: parsing its {len(data)} bytes "
        f"would take about {cost // MIB} MiB, and a body may take at most "
        f"{MEMORY_MULTIPLE} times its size plus {MEMORY_FLOOR // MIB} MiB; send fewer, "
        "larger values, or a large job as a .jsonl or .csv upload (read line by line)"
    )
