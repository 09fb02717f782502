"""Result rows written the cheaper way (orjson text, lz4 on Postgres, embeddings rounded
in one operation) read back, and export, exactly as the stdlib's writes did."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from db.models import Result
from db.results import iter_results, upsert_results
from db.session import session_factory, session_scope
from jobs.results import jsonl_lines
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
        got = {r.item_id: r.output["embedding"] for r in iter_results(session, job_id)}
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
