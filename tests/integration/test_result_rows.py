"""Result rows written the cheaper way (orjson text, lz4 on Postgres, embeddings rounded
in one operation) read back, and export, exactly as the stdlib's writes did."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from db.models import Result
from db.results import iter_results, upsert_results
from db.session import session_factory, session_scope
from jobs.results import jsonl_lines, result_record
from tests.factories import stored_job

OUTPUTS = [
    {"embedding": [0.123457, -1e-06, 0.0, -0.0, 1.0, -0.999999] * 64},
    {"label": "bill\u00e9", "score": 0.5, "scores": {"bill\u00e9": 0.5, "ship": -0.25}},
    {"entities": [{"type": "email", "text": "\u00e4@\u00f6.de \u2028", "start": 0, "end": 9}]},
]


def test_rows_read_back_and_export_as_the_stdlib_wrote_them(settings, migrated):
    job_id, _ = stored_job(settings, ["a", "b", "c"], prefix="r")
    rows = [
        {"idx": i, "item_id": f"r{i}", "label": out.get("label"), "output": out, "error": None}
        for i, out in enumerate(OUTPUTS)
    ]
    with session_scope(settings) as session:
        upsert_results(session, job_id, rows)
        upsert_results(session, job_id, rows)  # upserted again: still one row per item
    with session_scope(settings) as session:
        assert len(session.scalars(select(Result).where(Result.job_id == job_id)).all()) == 3
    with session_factory(settings)() as session:
        lines = list(jsonl_lines(iter_results(session, job_id)))
    expected = [
        json.dumps({"id": f"r{i}", **o}, ensure_ascii=False) + "\n" for i, o in enumerate(OUTPUTS)
    ]
    assert lines == expected


def test_an_embed_chunk_stores_each_vector_rounded_to_six_places(settings, migrated):
    import tasks.chunks
    from workers.model_host import get_pipeline

    texts = ["my parcel is late", "I was charged twice", "login fails", "x" * 3]
    job_id, (chunk_id,) = stored_job(settings, texts, tasks=["embed"], prefix="e")
    tasks.chunks.run_chunk.apply(args=(chunk_id,)).get()
    with session_factory(settings)() as session:
        stored = list(iter_results(session, job_id))
        got = {r.item_id: result_record(r)["embedding"] for r in stored}
    # The vector is float32 bytes beside the output, not JSON numbers inside it.
    assert all(r.output == {"tokens": r.output["tokens"]} for r in stored)
    assert all(len(r.vector) == 384 * 4 for r in stored)
    encoder = get_pipeline(settings).resolve("embed")
    direct = encoder.encode(texts).tolist()
    for i, row in enumerate(direct):
        vector = got[f"e{i}"]
        assert len(vector) == len(row) == 384
        assert all(v == round(v, 6) for v in vector)  # six places, as before
        assert vector == pytest.approx(row, abs=2e-6)


def test_a_second_write_overwrites_by_item_whichever_way_the_first_went(settings, migrated):
    """The first write of a chunk's rows goes by COPY on Postgres; a second one (a retried
    dead letter, a redelivery) that meets an item already written overwrites by upsert,
    its new items included, and a failed item reads back the same either way."""
    from sqlalchemy import text

    job_id, _ = stored_job(settings, ["a", "b", "c"], prefix="w")
    first = [
        {"idx": 0, "item_id": "w0", "label": None, "output": None, "error": "boom"},
        {"idx": 1, "item_id": "w1", "label": "x", "output": {"label": "x"}, "error": None},
    ]
    again = [
        {"idx": 1, "item_id": "w1", "label": "y", "output": {"label": "y"}, "error": None},
        {"idx": 2, "item_id": "w2", "label": None, "output": None, "error": "bang"},
    ]
    with session_scope(settings) as session:
        upsert_results(session, job_id, first)
    with session_scope(settings) as session:
        upsert_results(session, job_id, again)
    with session_scope(settings) as session:
        found = session.execute(
            text(
                "SELECT idx, label, CAST(output AS TEXT), error FROM results"
                " WHERE job_id = :job ORDER BY idx"
            ),
            {"job": job_id},
        ).all()
    assert [tuple(r) for r in found] == [
        (0, None, "null", "boom"),
        (1, "y", '{"label":"y"}', None),
        (2, None, "null", "bang"),
    ]


def test_vectors_are_bytes_in_the_row_and_numbers_to_every_reader(settings, migrated):
    """Vectors as the pipeline gives them (numpy), as the result cache's JSON gives them
    (lists), one that float32 cannot give back (stays JSON) and a row written before
    vectors were bytes: every reader sees the numbers it was given."""
    import numpy as np
    from sqlalchemy import text

    unit = [round(x, 6) for x in np.linspace(-1, 1, 384).tolist()]
    wide = [12345.678901, -0.5]
    outputs = [
        {"embedding": np.array(unit), "tokens": 7},
        {"embedding": unit, "tokens": 7},
        {"embedding": wide, "tokens": 2},
    ]
    job_id, _ = stored_job(settings, ["a", "b", "c", "d"], prefix="v")
    rows = [
        {"idx": i, "item_id": f"v{i}", "label": None, "output": out, "error": None}
        for i, out in enumerate(outputs)
    ]
    with session_scope(settings) as session:
        upsert_results(session, job_id, rows)
        # Written before this change: the vector inside the JSON, no bytes.
        session.execute(
            text("INSERT INTO results (job_id, idx, item_id, output) VALUES (:job, 3, 'v3', :out)"),
            {"job": job_id, "out": json.dumps({"embedding": unit, "tokens": 7})},
        )
    assert isinstance(outputs[0]["embedding"], np.ndarray)  # the caller's dict unchanged
    with session_factory(settings)() as session:
        stored = list(iter_results(session, job_id))
        lines = [json.loads(line) for line in jsonl_lines(iter_results(session, job_id))]
    assert [r.vector is not None for r in stored] == [True, True, False, False]
    assert [line["embedding"] for line in lines] == [unit, unit, wide, unit]
    assert [line["tokens"] for line in lines] == [7, 7, 2, 7]
    signs = [np.copysign(1, x) for x in lines[0]["embedding"]]
    assert signs == [np.copysign(1, x) for x in unit]


def test_an_overwrite_replaces_the_vector_too(settings, migrated):
    """A redelivered chunk's upsert (the second write) overwrites the bytes as well: an
    item that failed first and succeeded later has its vector, and the reverse has none."""
    job_id, _ = stored_job(settings, ["a", "b"], prefix="o")
    ok = {"embedding": [0.5, -0.25], "tokens": 3}
    first = [
        {"idx": 0, "item_id": "o0", "label": None, "output": None, "error": "boom"},
        {"idx": 1, "item_id": "o1", "label": None, "output": ok, "error": None},
    ]
    second = [
        {"idx": 0, "item_id": "o0", "label": None, "output": ok, "error": None},
        {"idx": 1, "item_id": "o1", "label": None, "output": None, "error": "late"},
    ]
    with session_scope(settings) as session:
        upsert_results(session, job_id, first)
    with session_scope(settings) as session:
        upsert_results(session, job_id, second)
    with session_factory(settings)() as session:
        got = [result_record(r) for r in iter_results(session, job_id)]
        vectors = [r.vector for r in iter_results(session, job_id)]
    assert got == [{"id": "o0", **ok}, {"id": "o1", "error": "late"}]
    assert vectors[0] is not None and vectors[1] is None
