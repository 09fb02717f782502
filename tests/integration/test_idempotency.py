"""`Idempotency-Key` on POST /v1/jobs, on the real app, Postgres and Redis: a submission
sent again returns the first job, another body is a 409, keys are per account, and two
racing requests with one key store one job."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import func, select

from db.models import IdempotencyKey, Job
from db.session import session_scope
from tests.integration.conftest import auth

BODY = {"items": [{"id": "a", "text": "my card was charged twice"}], "tasks": "classify"}


def _jobs_of(settings, account_id: int) -> int:
    with session_scope(settings) as session:
        return session.scalar(select(func.count()).where(Job.account_id == account_id))


def _post(client, key: str, idem: str | None, body=BODY):
    headers = auth(key) | ({"Idempotency-Key": idem} if idem is not None else {})
    return client.post("/v1/jobs", json=body, headers=headers)


def test_the_same_key_and_body_twice_store_one_job(client, account_factory, settings):
    account, key = account_factory()
    idem = str(uuid.uuid4())
    first = _post(client, key, idem)
    assert first.status_code == 202, first.json
    again = _post(client, key, idem)
    assert again.status_code == 200, again.json
    assert again.json["id"] == first.json["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Location"] == first.headers["Location"]
    assert _jobs_of(settings, account.id) == 1
    # Without a key, the same body is a new job each time.
    assert _post(client, key, None).json["id"] != first.json["id"]
    assert _jobs_of(settings, account.id) == 2


def test_the_same_key_with_another_body_is_a_409_naming_it(client, account_factory, settings):
    account, key = account_factory()
    idem = "order-17"
    assert _post(client, key, idem).status_code == 202
    other = {**BODY, "items": [{"id": "a", "text": "a different text"}]}
    response = _post(client, key, idem, other)
    assert response.status_code == 409
    assert response.json["error"] == "conflict"
    assert "Idempotency-Key" in response.json["message"]
    assert "different request body" in response.json["message"]
    assert _jobs_of(settings, account.id) == 1


def test_keys_are_per_account(client, account_factory, settings):
    (mine, my_key), (theirs, their_key) = account_factory(), account_factory()
    idem = "shared-name"
    first = _post(client, my_key, idem)
    other_body = {**BODY, "tasks": "score"}
    second = _post(client, their_key, idem, other_body)  # not a conflict: another account
    assert second.status_code == 202
    assert second.json["id"] != first.json["id"]
    # Another account's replay never reveals the first account's job.
    third = _post(client, their_key, idem, other_body)
    assert third.json["id"] == second.json["id"]
    assert _jobs_of(settings, mine.id) == 1 and _jobs_of(settings, theirs.id) == 1


def test_a_refused_submission_leaves_the_key_free(client, account_factory, settings):
    account, key = account_factory()
    bad = {"items": [{"id": "1", "text": "a"}, {"id": "1", "text": "b"}]}
    assert _post(client, key, "k1", bad).status_code == 400
    with session_scope(settings) as session:
        assert session.get(IdempotencyKey, (account.id, "k1")) is None
    # The corrected request may use the same key.
    assert _post(client, key, "k1").status_code == 202


@pytest.mark.parametrize("idem", ["", "x" * 256, "has space", "é"])
def test_a_malformed_key_is_a_400(client, account_factory, idem):
    _, key = account_factory()
    headers = auth(key) | {"Idempotency-Key": idem.encode().decode("latin-1")}
    response = client.post("/v1/jobs", json=BODY, headers=headers)
    assert response.status_code == 400
    assert "Idempotency-Key" in response.json["message"]


def test_an_expired_key_is_claimed_afresh(client, account_factory, settings):
    account, key = account_factory()
    first = _post(client, key, "old")
    with session_scope(settings) as session:
        row = session.get(IdempotencyKey, (account.id, "old"))
        row.expires_at = row.created_at
    again = _post(client, key, "old", {**BODY, "tasks": "score"})
    assert again.status_code == 202 and again.json["id"] != first.json["id"]


def test_racing_requests_with_one_key_store_one_job(app, account_factory, settings):
    account, key = account_factory()
    start = threading.Barrier(6)
    answers: list = []

    def send() -> None:
        client = app.test_client()
        start.wait()
        answers.append(_post(client, key, "race"))

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in answers)
    assert codes.count(202) == 1, codes
    # The others saw the first's job (200) or that it was still being stored (409).
    assert set(codes) <= {200, 202, 409}
    ids = {r.json["id"] for r in answers if r.status_code in (200, 202)}
    assert len(ids) == 1
    assert _jobs_of(settings, account.id) == 1


def test_an_upload_sent_again_is_one_job_and_another_file_a_409(client, account_factory, settings):
    import io

    account, key = account_factory()

    def upload(content: bytes):
        data = {"file": (io.BytesIO(content), "items.csv"), "tasks": "classify"}
        headers = auth(key) | {"Idempotency-Key": "nightly-upload"}
        return client.post(
            "/v1/jobs", data=data, headers=headers, content_type="multipart/form-data"
        )

    body = b"id,text\n1,refund my order\n2,my parcel is late\n"
    first = upload(body)
    assert first.status_code == 202, first.json
    again = upload(body)  # a new multipart boundary, the same fields and file
    assert again.status_code == 200 and again.json["id"] == first.json["id"]
    other = upload(body.replace(b"late", b"lost"))
    assert other.status_code == 409 and "different request body" in other.json["message"]
    assert _jobs_of(settings, account.id) == 1


def test_the_reconciler_sweeps_expired_keys_and_keeps_live_ones(account_factory, settings):
    from datetime import timedelta

    from db import idempotency
    from db.session import session_factory

    account, _ = account_factory()
    with session_factory(settings)() as session:  # claim commits, as the web view's does
        assert idempotency.claim(session, account.id, "old", "x", ttl=timedelta(seconds=-1)) is None
        assert idempotency.claim(session, account.id, "new", "x") is None
    with session_scope(settings) as session:
        assert idempotency.sweep(session) >= 1
    with session_scope(settings) as session:
        keys = set(
            session.scalars(
                select(IdempotencyKey.key).where(IdempotencyKey.account_id == account.id)
            )
        )
    assert keys == {"new"}
