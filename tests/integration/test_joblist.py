"""GET /v1/jobs on the real app and Postgres: newest first, keyset pages with no duplicate
or gap while jobs keep arriving, the status filter, another account's jobs never shown,
and a bad cursor, limit or status a 400 naming it."""

from __future__ import annotations

import base64
import uuid

import pytest
from sqlalchemy import update

from db.models import Job
from db.session import session_scope
from tests.integration.conftest import auth


def _submit(client, key: str, n: int = 1) -> list[str]:
    ids = []
    for i in range(n):
        body = {"items": [{"id": "a", "text": f"text {i}"}], "tasks": "score"}
        response = client.post("/v1/jobs", json=body, headers=auth(key))
        assert response.status_code == 202, response.json
        ids.append(response.json["id"])
    return ids


def _page(client, key: str, **params):
    return client.get("/v1/jobs", query_string=params, headers=auth(key))


def test_pages_cover_every_job_once_while_new_ones_arrive(client, account_factory):
    _, key = account_factory()
    older = _submit(client, key, 7)
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = _page(client, key, **params)
        assert page.status_code == 200, page.json
        seen += [job["id"] for job in page.json["data"]]
        _submit(client, key, 1)  # arrives between pages: newer than every page's jobs
        cursor = page.json["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(older))  # newest first, each once, none missing
    first = _page(client, key, limit=100).json
    assert len(first["data"]) == 7 + 3 and first["next_cursor"] is None
    assert set(first["data"][0]) >= {"id", "status", "lane", "created_at", "links"}
    assert first["data"][0]["links"]["self"] == f"/v1/jobs/{first['data'][0]['id']}"


def test_jobs_created_in_the_same_instant_are_paged_by_id(client, account_factory, settings):
    account, key = account_factory()
    ids = _submit(client, key, 5)
    with session_scope(settings) as session:  # one timestamp for all: the id breaks ties
        session.execute(
            update(Job).where(Job.account_id == account.id).values(created_at=Job.created_at)
        )
        moment = session.get(Job, uuid.UUID(ids[0])).created_at
        session.execute(update(Job).where(Job.account_id == account.id).values(created_at=moment))
    seen, cursor = [], None
    for _ in range(5):
        page = _page(client, key, limit=2, **({"cursor": cursor} if cursor else {})).json
        seen += [job["id"] for job in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == 5


def test_the_status_filter(client, account_factory, settings):
    account, key = account_factory()
    first, second, third = _submit(client, key, 3)
    with session_scope(settings) as session:
        session.execute(update(Job).where(Job.id == uuid.UUID(first)).values(status="succeeded"))
        session.execute(update(Job).where(Job.id == uuid.UUID(second)).values(status="failed"))
    done = _page(client, key, status="succeeded").json["data"]
    assert [j["id"] for j in done] == [first]
    ended = _page(client, key, status="succeeded,failed").json["data"]
    assert [j["id"] for j in ended] == [second, first]
    assert [j["id"] for j in _page(client, key, status="queued").json["data"]] == [third]


def test_another_accounts_jobs_are_never_listed(client, account_factory):
    (_, mine), (_, theirs) = account_factory(), account_factory()
    my_ids = set(_submit(client, mine, 3))
    their_ids = set(_submit(client, theirs, 2))
    assert {j["id"] for j in _page(client, mine, limit=100).json["data"]} == my_ids
    assert {j["id"] for j in _page(client, theirs, limit=100).json["data"]} == their_ids
    # Another account's cursor is only a position: it shows the caller's own jobs.
    cursor = _page(client, theirs, limit=1).json["next_cursor"]
    listed = {j["id"] for j in _page(client, mine, cursor=cursor, limit=100).json["data"]}
    assert listed <= my_ids


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"limit": "0"}, "'limit'"),
        ({"limit": "101"}, "'limit'"),
        ({"limit": "ten"}, "'limit'"),
        ({"cursor": "not-a-cursor"}, "'cursor'"),
        ({"cursor": "W10"}, "'cursor'"),  # base64 of [] : valid base64, not a position
        ({"cursor": "WyJ4IiwgInkiXQ"}, "'cursor'"),  # ["x", "y"]
        # Arrays nested past the JSON parser's depth: refused, not a 500.
        ({"cursor": base64.urlsafe_b64encode(b"[" * 2500).decode()}, "'cursor'"),
        ({"status": "done"}, "'done'"),
        ({"status": "queued,"}, "''"),
    ],
)
def test_bad_parameters_are_a_400_naming_them(client, account_factory, params, named):
    _, key = account_factory()
    response = _page(client, key, **params)
    assert response.status_code == 400, response.json
    assert response.json["error"] == "invalid_input"
    assert named in response.json["message"]


def test_listing_needs_a_key(client):
    assert client.get("/v1/jobs").status_code == 401
