"""/openapi.json describes every route; schemathesis fuzzes the app against it and finds no
5xx and no answer that breaks the document (real Postgres and Redis, real keys)."""

from __future__ import annotations

import dataclasses
import json
import re
import uuid

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, settings
from sqlalchemy import select

from db.accounts import create_account
from db.models import Account, Chunk, Job
from db.session import session_scope
from tests.integration.conftest import auth


def _openapi_path(rule: str) -> str:
    return re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", re.sub(r"\([^)]*\)", "", rule))


def test_every_route_and_method_is_in_the_document(app, client):
    document = client.get("/openapi.json").json
    documented = {
        (path, method.upper())
        for path, operations in document["paths"].items()
        for method in operations
        if method != "parameters"
    }
    routes = {
        (_openapi_path(rule.rule), method)
        for rule in app.url_map.iter_rules()
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    assert routes == documented
    # Every operation documents its errors: authenticated ones their 401 and 429.
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if method == "parameters" or operation.get("security") == []:
                continue
            assert {"401", "429"} <= set(operation["responses"]), (method, path)


def _fuzz_app():
    """The app, with limits high enough that the fuzzer is never refused for its pace.
    Made at import: schemathesis needs it to generate the cases."""
    from core.config.settings import Settings
    from webapp import create_app

    base = Settings.from_env()
    limits = {
        type_: dataclasses.replace(limit, rate_limit="100000/minute")
        for type_, limit in base.account_limits.items()
    }
    changes = {"account_limits": limits, "anonymous_rate_limit": "100000/minute"}
    # No interactive worker runs here: sync requests become jobs at once, not after 2 s.
    changes["sync_timeout"] = 0.0
    changes["sync_max_wait"] = 0.0
    return create_app(base.replace(**changes))


schema = schemathesis.openapi.from_wsgi("/openapi.json", _fuzz_app())


@pytest.fixture(scope="module")
def fuzz(settings, migrated):
    """An admin account to call with, and a trial account the fuzzer may change at will
    (trial jobs run one task per chunk on the cpu queue, which teardown empties of them)."""
    with session_scope(settings) as session:
        existing = set(session.scalars(select(Account.id)))
        tag = uuid.uuid4().hex[:8]
        admin, admin_key = create_account(session, f"fuzz-admin-{tag}", "trial", is_admin=True)
        victim, _ = create_account(session, f"fuzz-victim-{tag}", "trial")
        ids = admin.id, victim.id
    # The fuzzer may change any account but these: other tests' and its own.
    yield {"key": admin_key, "protected": existing | {ids[0]}, "victim": ids[1]}
    _drop_queued_chunks(settings, ids[0])


def _drop_queued_chunks(settings, account_id: int) -> None:
    """Take the fuzzer's jobs out of the broker: later tests' workers must not run them."""
    with session_scope(settings) as session:
        task_ids = set(
            session.scalars(
                select(Chunk.task_id).join(Job, Job.id == Chunk.job_id)
                .where(Job.account_id == account_id)
            )
        )  # fmt: skip
    broker = redis.Redis.from_url(settings.redis_url)
    for message in broker.lrange("cpu", 0, -1):
        if json.loads(message)["headers"]["id"] in task_ids:
            broker.lrem("cpu", 0, message)


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,  # the same cases every run: a failure here is never a fluke
    suppress_health_check=list(HealthCheck),
)
@pytest.mark.slow  # every operation's examples, positive and negative: seconds each
def test_no_server_errors_and_every_answer_as_documented(case, fuzz):
    params = case.path_parameters or {}
    if params.get("account_id") in fuzz["protected"]:
        params["account_id"] = fuzz["victim"]
    # positive_data_acceptance is left out: a schema cannot say that item ids are unique
    # within a job, nor what a valid CSV file is, so valid-looking data may rightly be 400.
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    excluded = [positive_data_acceptance]
    # No interactive worker runs here: a valid /v1/embeddings request is its documented 503
    # (OpenAI's clients know no 202 job); any other 5xx there still fails below.
    openai = case.path == "/v1/embeddings"
    if openai:
        excluded.append(not_a_server_error)
    response = case.call_and_validate(headers=auth(fuzz["key"]), excluded_checks=excluded)
    if openai and response.status_code >= 500:
        assert response.status_code == 503 and response.json()["error"]["code"] == "timeout"
