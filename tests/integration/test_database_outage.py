"""While Postgres is unreachable the API answers 503 with Retry-After and a JSON error (a
page: a 503 page), nothing is half-stored, and once it is back a submission works.

The app reaches the run's real Postgres through a gate (tests/gate.py) that the test shuts
like a network outage: open connections are cut, new ones refused."""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import psycopg
import pytest
from sqlalchemy import func, select

from db.models import Chunk, Job, JobItem
from db.session import session_scope
from tests.conftest import PG_ADMIN
from tests.gate import Gate
from tests.integration.conftest import auth

ITEMS = [{"id": "a", "text": "my card was charged twice"}, {"id": "b", "text": "box arrived late"}]


@pytest.fixture
def gate(settings):
    url = urlsplit(settings.database_url)
    g = Gate((url.hostname or "127.0.0.1", url.port or 5432))
    yield g
    g.close()


@pytest.fixture
def gated_app(make_app, settings, gate):
    url = urlsplit(settings.database_url)
    netloc = f"{url.username}@127.0.0.1:{gate.port}"
    # application_name: the test finds the app's own connections in pg_stat_activity.
    gated = url._replace(netloc=netloc, query="application_name=gated-web").geturl()
    return make_app(database_url=gated, anonymous_rate_limit="100000/minute")


def stored_for(settings, account_id) -> tuple[int, int, int]:
    """Jobs, items and chunks the account has, read past the gate."""
    with session_scope(settings) as s:
        jobs = s.scalars(select(Job.id).where(Job.account_id == account_id)).all()
        items = s.scalar(select(func.count()).select_from(JobItem).where(JobItem.job_id.in_(jobs)))
        chunks = s.scalar(select(func.count()).select_from(Chunk).where(Chunk.job_id.in_(jobs)))
    return len(jobs), items or 0, chunks or 0


def assert_unavailable(response) -> None:
    assert response.status_code == 503, (response.status_code, response.data[:300])
    assert int(response.headers["Retry-After"]) > 0
    assert response.json["error"] == "database_unavailable"
    assert "database" in response.json["message"]


def test_an_outage_is_a_503_and_nothing_is_stored(gated_app, gate, account_factory, settings):
    account, key = account_factory()
    client = gated_app.test_client()
    # Up: the app has pooled connections through the gate, which the outage then cuts.
    assert client.get("/v1/account", headers=auth(key)).status_code == 200
    created = client.post("/v1/jobs", json={"items": ITEMS}, headers=auth(key))
    assert created.status_code == 202
    job_url = created.headers["Location"]
    gate.down()
    assert_unavailable(client.post("/v1/jobs", json={"items": ITEMS}, headers=auth(key)))
    assert_unavailable(client.get(job_url, headers=auth(key)))
    assert_unavailable(client.get("/v1/account", headers=auth(key)))
    assert_unavailable(client.delete(job_url, headers=auth(key)))
    assert_unavailable(client.post("/v1/classify", json={"items": ITEMS}, headers=auth(key)))
    # A bad key is not told it is bad while keys cannot be checked.
    assert_unavailable(client.get("/v1/account", headers=auth("lw_deadbeef_nope")))
    assert stored_for(settings, account.id) == (1, 2, 1)
    gate.up()
    again = client.post("/v1/jobs", json={"items": ITEMS}, headers=auth(key))
    assert again.status_code == 202, again.json
    assert client.get(again.headers["Location"], headers=auth(key)).status_code == 200
    assert stored_for(settings, account.id) == (2, 4, 2)


def _page_unavailable(response) -> None:
    assert response.status_code == 503, (response.status_code, response.data[:300])
    assert int(response.headers["Retry-After"]) > 0
    assert response.mimetype == "text/html" and b"database is unavailable" in response.data


def test_the_pages_say_503(gated_app, gate, account_factory):
    _, key = account_factory()
    gated_app.config["WTF_CSRF_ENABLED"] = False
    signed_in, visitor = gated_app.test_client(), gated_app.test_client()
    base = "https://laneway.test"
    assert signed_in.post("/login", data={"api_key": key}, base_url=base).status_code == 303
    assert signed_in.get("/jobs", base_url=base).status_code == 200
    gate.down()
    _page_unavailable(visitor.post("/login", data={"api_key": key}, base_url=base))
    for path in ("/", "/jobs", "/dashboard"):
        _page_unavailable(signed_in.get(path, base_url=base))
    gate.up()
    assert signed_in.get("/jobs", base_url=base).status_code == 200


def _writing() -> bool:
    """The app's connection is inside a transaction that has begun inserting."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'gated-web' "
            "AND xact_start IS NOT NULL AND query ILIKE 'insert%'"
        ).fetchone()
    return bool(row and row[0])


def test_a_submission_cut_mid_write_leaves_nothing(gated_app, gate, account_factory, settings):
    """The job, its items and chunks are one transaction: cut while it is being written,
    none of it stays (and the caller hears 503, free to send it again)."""
    account, key = account_factory()
    client = gated_app.test_client()
    items = [{"id": str(n), "text": f"item number {n} of a long job"} for n in range(40_000)]
    answer: dict = {}

    def submit() -> None:
        answer["response"] = client.post("/v1/jobs", json={"items": items}, headers=auth(key))

    writer = threading.Thread(target=submit)
    writer.start()
    deadline = time.monotonic() + 60
    while not _writing() and "response" not in answer:
        assert time.monotonic() < deadline, "the submission never began writing"
        time.sleep(0.005)
    gate.down()
    writer.join(120)
    response = answer["response"]
    jobs, stored_items, chunks = stored_for(settings, account.id)
    if response.status_code == 202:  # it committed before the cut: then wholly
        pytest.fail("the submission committed before the gate shut; make the job larger")
    assert_unavailable(response)
    assert (jobs, stored_items, chunks) == (0, 0, 0)
    gate.up()
    assert client.post("/v1/jobs", json={"items": ITEMS}, headers=auth(key)).status_code == 202
    assert stored_for(settings, account.id) == (1, 2, 1)
