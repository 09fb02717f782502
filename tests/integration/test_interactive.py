"""The interactive path through a real interactive worker (`laneway worker interactive`) on
the run's Redis and Postgres: inline answers, the 202 job past the timeout, the
asynchronous pair, per-item errors, a failing batch, dedup and the item limit."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from sqlalchemy import select

from db.models import Job, JobItem
from db.session import session_scope
from laneway.settings import POISON_MARKER
from tests.e2e.procs import BIN, start_worker
from tests.integration.conftest import auth

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def worker(tmp_path_factory, settings, migrated):
    """One interactive worker for the module: poison faults on, the result cache on."""
    from tests.broker import empty_queues

    empty_queues(settings)  # earlier tests' interactive messages nobody waits for
    logdir = tmp_path_factory.mktemp("interactive")
    argv = [str(BIN / "laneway"), "worker", "interactive", "--name", "interactive-it"]
    env = {"LANEWAY_FAULTS": "poison", "LANEWAY_CACHE_TTL": "300"}
    proc = start_worker("interactive-it", argv, logdir, env=env)
    yield proc
    proc.stop()


@pytest.fixture
def app(make_app):
    return make_app(anonymous_rate_limit="100000/minute", sync_timeout=30.0)


def tag() -> str:
    return uuid.uuid4().hex[:8]


def post(client, key, task, texts, **extra):
    items = [{"id": str(n), "text": t} for n, t in enumerate(texts)]
    return client.post(f"/v1/{task}", json={"items": items, **extra}, headers=auth(key))


def test_each_task_is_answered_inline(worker, client, account_factory):
    _, key = account_factory("demo")
    t = tag()
    r = post(client, key, "classify", [f"I was charged twice {t}", f"where is my parcel {t}"],
             labels=["billing", "shipping"])  # fmt: skip
    assert r.status_code == 200, r.json
    assert [x["label"] for x in r.json["results"]] == ["billing", "shipping"]
    # Counted against the account's rate limit like every other call (demo: 60/minute).
    assert r.headers["RateLimit-Limit"] == "60" and int(r.headers["RateLimit-Remaining"]) < 60
    assert set(r.json["results"][0]["scores"]) == {"billing", "shipping"}
    r = post(client, key, "embed", [f"hello {t}"])
    assert r.status_code == 200 and len(r.json["results"][0]["embedding"]) == 384
    r = post(client, key, "score", [f"I love it, thank you so much {t}"])
    assert r.status_code == 200 and r.json["results"][0]["rating"] > 0
    r = post(client, key, "extract", [f"write to help@example.com {t}"])
    assert r.status_code == 200
    assert {"type": "email", "text": "help@example.com"}.items() <= r.json["results"][0][
        "entities"
    ][0].items()


def test_no_answer_in_time_becomes_a_job_and_nothing_is_lost(client, account_factory):
    _, key = account_factory("trial")
    texts = [f"late one {tag()}", f"late two {tag()}"]
    r = client.post(
        "/v1/score",
        json={"items": [{"id": "a", "text": texts[0]}, {"id": "b", "text": texts[1]}]},
        headers={**auth(key), "Prefer": "wait=0"},
    )
    assert r.status_code == 202, r.json
    assert r.headers["Location"] == r.json["links"]["self"] == f"/v1/jobs/{r.json['id']}"
    assert r.headers["Preference-Applied"] == "wait=0"
    with session_scope() as session:
        job = session.get(Job, uuid.UUID(r.json["id"]))
        assert job is not None and job.tasks == ["score"] and job.status == "queued"
        stored = session.execute(
            select(JobItem.item_id, JobItem.text).where(JobItem.job_id == job.id)
        ).all()
    assert sorted(stored) == [("a", texts[0]), ("b", texts[1])]
    assert client.get(r.json["links"]["self"], headers=auth(key)).status_code == 200


def test_the_asynchronous_pair(worker, client, account_factory):
    _, key = account_factory("trial")
    _, other = account_factory("trial")
    body = {"tasks": ["classify", "score"], "items": [{"id": "x", "text": f"refund me {tag()}"}]}
    r = client.post("/v1/inference", json=body, headers=auth(key))
    assert r.status_code == 202 and r.json["status"] == "PENDING"
    link = r.json["links"]["result"]
    assert r.headers["Location"] == link == f"/v1/result/{r.json['task_id']}"
    # Another account's task is not there for it; a made-up one is not there for anyone.
    assert client.get(link, headers=auth(other)).status_code == 404
    assert client.get(f"/v1/result/{uuid.uuid4().hex}", headers=auth(key)).status_code == 404
    got = client.get(link, headers={**auth(key), "Prefer": "wait=30"})
    assert got.status_code == 200 and got.headers["Preference-Applied"] == "wait=30"
    assert got.json["status"] == "SUCCESS", got.json
    (item,) = got.json["output"]
    assert item["id"] == "x" and "label" in item and -1 <= item["rating"] <= 1
    # It stays there to be read again.
    assert client.get(link, headers=auth(key)).json == got.json


def test_each_request_gets_its_own_results_and_errors(worker, client, account_factory):
    _, key = account_factory("standard")
    t = tag()

    def call(texts):
        return post(client, key, "embed", texts)

    requests = [[f"fine {n} {t}"] for n in range(6)]
    requests += [[f"good {t}", f"bad {POISON_MARKER} {t}", f"good too {t}"]]
    requests += [[f"{POISON_MARKER} alone {t}"]]
    with ThreadPoolExecutor(len(requests)) as pool:  # concurrent: they share batches
        answers = list(pool.map(call, requests))
    for texts, r in zip(requests, answers, strict=True):
        assert r.status_code == 200, r.json
        for text, res in zip(texts, r.json["results"], strict=True):
            if POISON_MARKER in text:
                assert "poison item" in res["error"] and "embedding" not in res
            else:
                assert "error" not in res and len(res["embedding"]) == 384


def test_a_failing_batch_fails_each_request_and_hangs_none(worker, client, account_factory):
    _, key = account_factory("standard")
    t = tag()
    body = {"task": "embed", "items": [{"id": "p", "text": f"{POISON_MARKER} {t}"}]}
    ids = [client.post("/v1/inference", json=body, headers=auth(key)).json["task_id"]]

    def call(n):
        return post(client, key, "embed", [f"{POISON_MARKER} {n} {t}", f"{POISON_MARKER} b{n}"])

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(call, range(4)))
    for r in answers:
        assert r.status_code == 200, r.json
        assert all("poison item" in x["error"] for x in r.json["results"])
    got = client.get(f"/v1/result/{ids[0]}", headers={**auth(key), "Prefer": "wait=30"}).json
    assert got["status"] == "FAILURE" and "poison item" in got["error"]
    assert got["output"] == [{"id": "p", "error": got["error"]}]


def test_identical_texts_are_computed_once_and_then_come_from_the_cache(
    worker, make_app, settings, account_factory
):
    client = make_app(
        anonymous_rate_limit="100000/minute", sync_timeout=30.0, cache_ttl=300
    ).test_client()
    _, key = account_factory("standard")
    t = tag()
    texts = [f"same {t}", f"other {t}", f"same {t}"]
    first = post(client, key, "embed", texts)
    assert first.status_code == 200 and first.json["cached"] is False
    results = first.json["results"]
    assert results[0]["embedding"] == results[2]["embedding"] != results[1]["embedding"]
    r = redis.Redis.from_url(settings.redis_url)
    keys = r.keys("laneway:cache:*")
    # The worker stored each distinct text once, with the TTL.
    from laneway.cache import cache_key, task_identity

    identity = task_identity(settings, "embed", [])
    mine = {cache_key(identity, x).encode() for x in texts}
    assert len(mine) == 2 and mine <= set(keys)
    assert 0 < r.ttl(next(iter(mine))) <= 300
    again = post(client, key, "embed", texts)
    assert again.status_code == 200 and again.json["cached"] is True
    assert again.json["results"] == results


def test_too_many_items_is_a_400_naming_the_setting(client, account_factory):
    _, key = account_factory("enterprise")
    r = post(client, key, "classify", [f"t{n}" for n in range(33)])
    assert r.status_code == 400 and "LANEWAY_SYNC_MAX_ITEMS" in r.json["message"]
    r = client.post("/v1/inference", json={"items": [{"id": n, "text": "x"} for n in range(33)]},
                    headers=auth(key))  # fmt: skip
    assert r.status_code == 400 and "LANEWAY_SYNC_MAX_ITEMS" in r.json["message"]
    r = post(client, key, "embed", ["a", "b"])
    dup = client.post("/v1/embed", json={"items": [{"id": "1", "text": "a"}, {"id": "1",
                      "text": "b"}]}, headers=auth(key))  # fmt: skip
    assert dup.status_code == 400 and "duplicate id" in dup.json["message"]
    assert client.post("/v1/embed", data="x", headers=auth(key)).status_code == 415
    assert client.post("/v1/embed", json={"items": []}, headers=auth(key)).status_code == 400
