"""Embeddings as float32 bytes (core/util/vectors.py): every value given comes back."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.store.cache import entry, read_entry
from core.util.vectors import join, pack, split, split_many, unpack

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


# What a chunk's outputs may hold: the pipeline's float64 rows (of one length, or not),
# values float32 cannot give back, lists (a cached output read from JSON), integers, empty
# vectors, outputs without a vector, failed items (None).
_component = st.one_of(six_places, st.sampled_from([8.0, -9.5, math.nan, math.inf, -math.inf]))
_vector = st.one_of(
    st.lists(six_places, min_size=3, max_size=3).map(np.array),
    st.lists(_component, min_size=3, max_size=3).map(np.array),
    st.lists(six_places, min_size=0, max_size=5).map(np.array),
    st.lists(six_places, min_size=3, max_size=3),
    st.lists(st.integers(-5, 5), min_size=3, max_size=3).map(np.array),
)
_output = st.one_of(
    st.none(),
    st.fixed_dictionaries({"embedding": _vector}),
    st.fixed_dictionaries({"embedding": _vector, "label": st.sampled_from(["a", "b"])}),
    st.fixed_dictionaries({"label": st.just("a")}),
    st.fixed_dictionaries({"embedding": st.none()}),
)


# A chunk as the pipeline makes it: every output a vector of one length (rows of one array,
# or lists), some with a label, some with values float32 cannot give back, or whose float32
# rounds up to 8 (7.9999999: packed, as `pack` decides on the values as given).
_edge = st.sampled_from([8.0, -9.5, 7.9999999, -7.9999999, math.nan, math.inf, 1e300])
_alike_chunk = st.integers(1, 4).flatmap(
    lambda n: st.lists(
        st.fixed_dictionaries(
            {
                "embedding": st.one_of(
                    st.lists(st.one_of(six_places, _edge), min_size=n, max_size=n).map(np.array),
                    st.lists(six_places, min_size=n, max_size=n),
                    st.lists(st.integers(-9, 9), min_size=n, max_size=n).map(np.array),
                )
            },  # fmt: skip
            optional={"label": st.sampled_from(["a", "b"])},
        ),
        max_size=12,
    )
)


@given(st.one_of(st.lists(_output, max_size=12), _alike_chunk))
def test_a_chunks_vectors_packed_together_are_each_vector_packed_alone(outputs) -> None:
    """split_many gives what split gives each output, whatever the chunk mixes, and leaves
    every output as it was."""
    before = [None if o is None else dict(o) for o in outputs]
    together, alone = split_many(outputs), [split(o) for o in outputs]
    assert len(together) == len(alone)
    for (out, packed), (out_alone, packed_alone) in zip(together, alone, strict=True):
        assert packed == packed_alone
        if packed is None:
            assert out is out_alone  # kept whole: the same object
        else:
            assert out == out_alone and "embedding" not in out
    for o, b in zip(outputs, before, strict=True):
        assert o is b is None or (o.keys() == b.keys() and all(o[k] is b[k] for k in b))
