"""What a chunk writes for each result, made cheaper without changing it: embeddings
rounded in one tensor operation, JSON text from orjson (core/util/jsoncodec.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from core.util.jsoncodec import dumps
from inference.pipeline import rounded_rows


def test_rounding_in_one_operation_equals_rounding_each_float():
    torch.manual_seed(7)
    unit = torch.nn.functional.normalize(torch.randn(512, 384), dim=1)
    awkward = torch.tensor(
        [[0.0, -0.0, 5e-7, -5e-7, 1.5e-6, 2.5e-6, 1.25e-5, 1.0, -1.0, 0.9999995, 3.4e38]]
    )
    for vectors in (unit, torch.rand(256, 384) * 2 - 1, awkward):
        expected = [[round(x, 6) for x in row] for row in vectors.tolist()]
        got = rounded_rows(vectors)
        assert got.tolist() == expected
        # Signs of zero too (-0.0 == 0.0 would hide them): the values must not change.
        assert json.dumps(got.tolist()) == json.dumps(expected)
        # As JSON (orjson writes the array itself): the same numbers, signs included.
        parsed = [json.loads(dumps(row)) for row in got]
        assert parsed == expected
        signs = [[math.copysign(1, x) for x in row] for row in parsed]
        assert signs == [[math.copysign(1, x) for x in row] for row in expected]


def test_no_rows_no_floats():
    assert rounded_rows(torch.empty((0, 384))).tolist() == []


def test_an_array_the_stdlib_must_write_is_written_as_numbers():
    # Past 64 bits orjson refuses the whole value; the stdlib fallback writes arrays too.
    value = {"n": 2**80, "embedding": np.array([0.25, -0.5])}
    assert json.loads(dumps(value)) == {"n": 2**80, "embedding": [0.25, -0.5]}


@pytest.mark.parametrize(
    "value",
    [
        {"embedding": [0.123457, -1e-06, 0.0, -0.0, 1.0, 12345.678901]},
        {"label": "billing", "score": 0.5, "scores": {"billing": 0.5, "shipping": -0.25}},
        {"entities": [{"type": "email", "text": "ä@ö.de ✓ \u2028", "start": 0, "end": 6}]},
        {"label": None, "rating": -1.0, "nested": [[1, 2], [], {}]},
        ['quote " backslash \\ newline \n tab \t nul \u0000'],
    ],
)
def test_the_text_parses_back_to_the_same_value_as_the_stdlibs(value):
    text = dumps(value)
    assert isinstance(text, str)
    assert json.loads(text) == json.loads(json.dumps(value))


def test_what_orjson_refuses_still_serializes():
    huge = {"n": 2**80, "m": -(2**70)}
    assert json.loads(dumps(huge)) == huge


def test_keys_and_containers_as_the_stdlib_writes_them():
    assert json.loads(dumps({1: "a", "b": (1, 2)})) == {"1": "a", "b": [1, 2]}
    assert json.loads(dumps(np.array([0.5, 1.5], dtype=np.float32))) == [0.5, 1.5]


def test_non_finite_floats_become_null_not_invalid_json():
    # The stdlib writes NaN, which Postgres refuses for a json column.
    assert json.loads(dumps({"x": math.nan, "y": math.inf})) == {"x": None, "y": None}
