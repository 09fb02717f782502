"""A job's items reach job_items by two paths (db/intake.py): a stream (a file) through the
temporary table, sorted by Postgres or SQLite, and a body already in memory (JSON)
collected and sorted here. Both write the same rows and name the same repeated id, on both
databases."""

from __future__ import annotations

import random
import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from db.intake import DuplicateItem, collect_items, create_job, stage_items
from db.models import Job, JobItem
from db.session import make_engine
from jobs.planner import plan_chunks
from tests.factories import sqlite_with_account

PATHS = {"staged": stage_items, "collected": collect_items}


def _items(seed: int, n: int) -> list[tuple[str, str, int]]:
    """(id, text, place) rows with many ties in length, multi-byte characters (Postgres'
    length() counts characters, not bytes) and places that skip, as a file's lines do."""
    rng = random.Random(seed)
    alphabet = "ab é漢😀\t"
    rows, place = [], 0
    for n_ in range(n):
        place += rng.choice((1, 1, 2))
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        rows.append((f"id-{n_}-{rng.randint(0, 9)}", text, place))
    return rows


def _store(session: Session, account_id: int, path: str, rows) -> uuid.UUID:
    items = PATHS[path](session, iter(rows))
    job = create_job(
        session,
        account_id=account_id,
        tasks=["embed"],
        labels=[],
        items=items,
        lane="cpu",
        chunks=plan_chunks(items.count, 7),
        chunk_size=7,
    )
    return job.id


def _written(session: Session, job_id: uuid.UUID) -> list[tuple]:
    rows = session.execute(
        select(JobItem.pos, JobItem.idx, JobItem.item_id, JobItem.text)
        .where(JobItem.job_id == job_id)
        .order_by(JobItem.pos)
    )
    return [tuple(r) for r in rows]


@pytest.fixture(params=["postgres", "sqlite"])
def database(request, tmp_path, settings, migrated):
    """A session and an account on the run's Postgres (rolled back) or a new SQLite file."""
    if request.param == "postgres":
        account, _ = request.getfixturevalue("account_factory")("standard")  # committed
        yield request.getfixturevalue("db_session"), account.id
        return
    with sqlite_with_account(tmp_path / "laneway.db") as (engine, account_id):
        with Session(engine) as session:
            yield session, account_id


@pytest.mark.parametrize("seed,n", [(1, 1), (2, 40), (3, 700)])
def test_both_paths_write_the_same_rows(database, seed, n):
    session, account_id = database
    rows = _items(seed, n)
    written = {path: _written(session, _store(session, account_id, path, rows)) for path in PATHS}
    assert written["collected"] == written["staged"]
    # Length order, ties in input order, every item once.
    assert [r[0] for r in written["staged"]] == list(range(n))
    assert sorted(r[1] for r in written["staged"]) == list(range(n))
    keys = [(len(r[3]), r[1]) for r in written["staged"]]
    assert keys == sorted(keys)


@pytest.mark.parametrize(
    "ids,expected",
    [
        (["a", "b", "a"], ("a", 2, 0)),
        (["a", "b", "b", "a"], ("b", 2, 1)),  # the first repeat in input order
        (["x", "y", "z", "z", "y", "x"], ("z", 3, 2)),
    ],
)
def test_both_paths_name_the_first_repeated_id_and_write_nothing(database, ids, expected):
    session, account_id = database
    rows = [(item_id, f"text {n}", n) for n, item_id in enumerate(ids)]
    mine = select(JobItem.job_id).join(Job, Job.id == JobItem.job_id)
    for path in PATHS:
        with pytest.raises(DuplicateItem) as err:
            _store(session, account_id, path, rows)
        assert (err.value.item_id, err.value.place, err.value.first) == expected, path
        assert session.scalars(mine.where(Job.account_id == account_id)).first() is None, path
        session.rollback()


def test_a_body_past_the_collect_limit_streams_as_a_file_does(
    monkeypatch, settings, account_factory
):
    import jobs.submit as submit
    from jobs.inputs import Limits, json_items

    monkeypatch.setattr(submit, "COLLECT_MAX_ITEMS", 3)
    used = []
    for path in PATHS.values():

        def spy(*args, _path=path, **kwargs):
            used.append(_path.__name__)
            return _path(*args, **kwargs)

        monkeypatch.setattr(submit, path.__name__, spy)
    account, _ = account_factory("standard")
    limits = Limits(100, 1000)
    for n in (3, 4):
        body = [{"id": str(i), "text": "x" * (n - i)} for i in range(n)]
        job = submit.submit_job(account, json_items(body, limits), tasks=["embed"])
        with Session(make_engine(settings.database_url)) as session:
            assert [r[1] for r in _written(session, job.id)] == list(range(n))[::-1]
    assert used == ["collect_items", "stage_items"]
