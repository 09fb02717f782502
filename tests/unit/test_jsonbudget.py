"""The JSON body's parse cost, found before parsing: marks outside strings only, across
block edges, and an upper bound of what json.loads really allocates."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webapp import jsonbudget
from webapp.jsonbudget import MIB, budget, parse_cost, quick_cost, structure, too_costly


def reference(data: bytes) -> tuple[int, int, int]:
    """A byte-at-a-time scanner: the obvious way, to check the vectorised one against."""
    braces = colons = marks = 0
    inside = escaped = False
    for c in data.decode("latin-1"):
        if inside:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                inside = False
        elif c == '"':
            inside = True
        elif c == "{":
            braces += 1
        elif c == ":":
            colons += 1
        elif c in "[,":
            marks += 1
    return braces, colons, marks


@pytest.mark.parametrize(
    "text,expected",
    [
        (b'{"a": "[,:{"}', (1, 1, 0)),
        (rb'["x\"[,{", 1]', (0, 0, 2)),
        (rb'["x\\", [1]]', (0, 0, 3)),  # an escaped backslash ends the string
        (rb'["\\\"{", {"a": 1}]', (1, 1, 2)),
        (b"[]", (0, 0, 1)),
        (b"", (0, 0, 0)),
    ],
)
def test_marks_inside_strings_do_not_count(text, expected):
    assert structure(text) == expected == reference(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab"\\[{,:}] é\U0001f600'),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=30,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(min_value=1, max_value=7))
def test_any_json_scans_as_the_reference_does_across_block_edges(value, block):
    data = json.dumps(value, ensure_ascii=False).encode()
    original = jsonbudget.BLOCK
    jsonbudget.BLOCK = block  # tiny blocks: every string, escape and run crosses an edge
    try:
        assert structure(data) == reference(data)
    finally:
        jsonbudget.BLOCK = original


def _body(item: bytes, n: int) -> bytes:
    return b"[" + b",".join([item] * n) + b"]"


SHAPES = {
    "empty lists": _body(b"[]", 100_000),
    "empty objects": _body(b"{}", 100_000),
    "nested lists": _body(b"[[]]", 100_000),
    "one-key objects": _body(b'{"a":0}', 100_000),
    "unique keys": b"[" + b",".join(b'{"k%d":0}' % n for n in range(100_000)) + b"]",
    "one wide object": b"{" + b",".join(b'"k%d":1' % n for n in range(100_000)) + b"}",
    "short strings": _body(b'"ab"', 100_000),
    "emoji strings": _body('"a\U0001f600"'.encode(), 100_000),
    "numbers": _body(b"1000", 100_000),
    "floats": _body(b"1.5", 100_000),
    "items": b"["
    + b",".join(b'{"id":"%d","text":"text %d"}' % (n, n) for n in range(100_000))
    + b"]",
}


@pytest.mark.parametrize("name", SHAPES)
def test_the_cost_is_an_upper_bound_of_what_parsing_allocates(name):
    data = SHAPES[name]
    tracemalloc.start()
    try:
        parsed = json.loads(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del parsed
    assert peak <= parse_cost(data), (name, peak, parse_cost(data))


@pytest.mark.slow
def test_bodies_shaped_to_be_expensive_are_refused_and_ordinary_ones_are_not():
    big = 8 * MIB
    # (Empty strings are cheap: CPython has one, shared.)
    for item in (b"[]", b"{}", b"[[]]", b'{"a":{}}', b"0", b'{"a":0}'):
        data = _body(item, big // (len(item) + 1))
        message = too_costly(data)
        assert message and "too many values" in message and ".jsonl" in message
    text = b'{"id": "%d", "text": "my parcel arrived two weeks late and damaged %d"}'
    ordinary = b'{"items": [' + b",".join(text % (n, n) for n in range(110_000)) + b"]}"
    assert len(ordinary) > big and too_costly(ordinary) is None
    # Small bodies are never refused, whatever their shape.
    assert too_costly(_body(b"[]", 1000)) is None
    assert budget(1) > 64 * MIB


@given(json_values)
def test_the_quick_count_is_never_below_the_scans_cost(value):
    data = json.dumps(value, ensure_ascii=False).encode()
    assert quick_cost(data) >= parse_cost(data)


@pytest.mark.slow
def test_texts_full_of_marks_are_scanned_not_refused():
    """Texts of brackets, commas and colons make the quick count exceed the budget; the
    scan, which skips strings, finds the body cheap and lets it through."""
    text = b'{"id": "%d", "text": "' + b"[,{:" * 40 + b'"}'
    body = b'{"items": [' + b",".join(text % n for n in range(60_000)) + b"]}"
    assert quick_cost(body) > budget(len(body)) >= parse_cost(body)
    assert too_costly(body) is None
