"""Embeddings as float32 bytes (core/util/vectors.py): every value given comes back."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.store.cache import entry, read_entry
from core.util.vectors import join, pack, split, unpack

six_places = st.floats(-7.999999, 7.999999).map(lambda x: round(x, 6))


@given(st.lists(six_places, max_size=400))
def test_six_place_values_below_eight_come_back_exactly(values: list[float]) -> None:
    packed = pack(values)
    assert packed is not None and len(packed) == 4 * len(values)
    back = unpack(packed).tolist()
    assert back == values
    assert [math.copysign(1, x) for x in back] == [math.copysign(1, x) for x in values]


@pytest.mark.parametrize(
    "values",
    [[8.0], [-8.5, 0.1], [math.nan], [math.inf], [[0.1, 0.2]], ["0.1"], [None], "text"],
)
def test_what_float32_cannot_give_back_is_not_packed(values: object) -> None:
    assert pack(values) is None  # type: ignore[arg-type]
    if isinstance(values, list) and all(isinstance(v, float) for v in values):
        assert pack(np.array(values)) is None  # the pipeline's rows take a quicker path


@given(st.lists(six_places, max_size=400))
def test_the_pipelines_rows_pack_as_lists_do(values: list[float]) -> None:
    assert pack(np.array(values, dtype=np.float64)) == pack(values)


def test_split_leaves_the_given_output_alone_and_join_restores_it() -> None:
    vector = np.array([0.5, -0.25, 0.0])
    output = {"embedding": vector, "tokens": 3}
    rest, packed = split(output)
    assert rest == {"tokens": 3} and packed is not None
    assert output["embedding"] is vector  # shared with other threads: never changed
    assert join(rest, packed) == {"tokens": 3, "embedding": [0.5, -0.25, 0.0]}


@pytest.mark.parametrize(
    "output",
    [None, {}, {"label": "x"}, {"embedding": None}, {"embedding": [9.0, 1.0], "tokens": 2}],
)
def test_an_output_without_a_packable_vector_is_kept_whole(output: dict | None) -> None:
    assert split(output) == (output, None)
    assert join(output, None) == dict(output or {})


@given(
    st.dictionaries(
        st.text(max_size=5).filter(lambda k: k != "embedding"),
        st.one_of(st.text(), st.integers(-(2**60), 2**60), st.booleans()),
        max_size=4,
    ),
    st.lists(six_places, max_size=50),
)
def test_a_cache_entry_reads_back_as_written(fields: dict, vector: list[float]) -> None:
    written = {**fields, "embedding": vector}
    got = read_entry(entry(written))
    assert set(got) == set(written)
    assert got["embedding"].tolist() == vector
    assert {k: v for k, v in got.items() if k != "embedding"} == fields


def test_a_json_cache_entry_of_before_reads_as_written() -> None:
    assert read_entry(b'{"embedding":[0.1,-0.2],"tokens":2}') == {
        "embedding": [0.1, -0.2],
        "tokens": 2,
    }
