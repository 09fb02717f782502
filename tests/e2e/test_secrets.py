"""No secret reaches a log or an answer: gunicorn's access and error logs, the app's log and
a Celery worker's log, with passwords in both service URLs and API keys sent every way."""

from __future__ import annotations

import uuid

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.e2e.procs import BIN, start_web, start_worker, wait_for

pytestmark = pytest.mark.e2e


def test_no_key_or_password_in_any_log_or_answer(settings, migrated, account_factory, tmp_path):
    db_password, redis_password = f"dbpw{uuid.uuid4().hex}", f"rdpw{uuid.uuid4().hex}"
    # Postgres trusts local connections and Redis' default user has no password: both
    # accept any password, so the URLs carry one without the services needing it.
    db_url = make_url(settings.database_url).set(password=db_password)
    redis_url = settings.redis_url.replace("redis://", f"redis://default:{redis_password}@", 1)
    env = {
        "LANEWAY_DATABASE_URL": db_url.render_as_string(hide_password=False),
        "LANEWAY_REDIS_URL": redis_url,
    }
    _, key = account_factory("standard")
    secret = key.split("_", 2)[2]
    wrong = f"{key[:15]}_{uuid.uuid4().hex}wrong"

    web, url = start_web(tmp_path, env)
    argv = [str(BIN / "celery"), "-A", "tasks", "worker", "-Q", "cpu", "-n", "secrets@%h"]
    worker = start_worker("secrets", [*argv, "-c", "1", "--loglevel", "DEBUG"], tmp_path, env)
    try:
        bearer = {"Authorization": f"Bearer {key}"}
        answers = [
            httpx.get(f"{url}/v1/account", headers={"Authorization": f"Bearer {wrong}"}),
            # A key sent as a Basic-auth user, or in the query string, is not accepted, and
            # must not be logged either.
            httpx.get(f"{url}/v1/account", auth=(key, "")),
            httpx.get(f"{url}/v1/account", params={"api_key": key}),
            httpx.post(f"{url}/login", data={"api_key": key}),
            httpx.post(f"{url}/v1/jobs", content=b"{oops", headers=bearer),
        ]
        assert [a.status_code for a in answers] == [401, 401, 401, 400, 415]
        # The first submission imports the task modules (and torch) into the web worker.
        job = httpx.post(
            f"{url}/v1/jobs",
            json={"items": [{"id": "1", "text": "hello"}]},
            headers=bearer,
            timeout=60,
        ).json()

        def done() -> bool:
            status = httpx.get(f"{url}/v1/jobs/{job['id']}", headers=bearer).json()["status"]
            # The job is final as soon as the chunk has written it, a moment before the
            # worker logs the task's success: stopped in between, the log would lack it.
            return status == "succeeded" and "succeeded in" in worker.log.read_text()

        wait_for(done, 120, "the job to succeed and its task to log it", [web, worker])
    finally:
        worker.stop()
        web.stop()

    logs = {p.name: p.log.read_text(errors="replace") for p in (web, worker)}
    # The logs are not empty: they show the requests and the task, with secrets masked.
    assert '"GET /v1/account?api_key=' + key[:15] + '_*** HTTP/1.1" 401' in logs["web"]
    assert '/v1/jobs HTTP/1.1" 202' in logs["web"]
    assert "redis://default:**@" in logs["secrets"], worker.tail()
    for where, text in [*logs.items(), *((a.url, a.text) for a in answers)]:
        for leaked in (secret, wrong.split("_", 2)[2], db_password, redis_password):
            assert leaked not in text, f"{leaked[:6]}... appears in {where}"
