"""The interactive path through a real interactive worker (`laneway worker interactive`) on
the run's Redis and Postgres: inline answers, the 202 job past the timeout, the
asynchronous pair, per-item errors, a failing batch, dedup and the item limit."""

from __future__ import annotations

import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
import redis
from sqlalchemy import select

from core.vocab import POISON_MARKER, STALL_MARKER
from db.models import Job, JobItem
from db.session import session_scope
from tests.e2e.procs import BIN, start_worker, wait_for
from tests.integration.conftest import auth

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def worker(tmp_path_factory, settings, migrated):
    """One interactive worker for the module: poison and stall faults on, the result cache
    on, a heartbeat every second."""
    from tests.broker import empty_queues

    empty_queues(settings)  # earlier tests' interactive messages nobody waits for
    logdir = tmp_path_factory.mktemp("interactive")
    argv = [str(BIN / "laneway"), "worker", "interactive", "--name", "interactive-it"]
    env = {
        "LANEWAY_FAULTS": "poison,stall",
        "LANEWAY_CACHE_TTL": "300",
        "LANEWAY_WORKER_HEARTBEAT": "1",
    }
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


def cache_keys(settings, account_id: int, texts: list[str]) -> set[bytes]:
    """The result cache's keys of an account's embeddings of `texts`."""
    from core.store.cache import cache_key, cache_scope, task_identity

    identity = task_identity(settings, "embed", [], cache_scope(settings, account_id))
    return {cache_key(identity, x).encode() for x in texts}


def wait_stored(settings, account_id: int, texts: list[str]) -> set[bytes]:
    """The worker stores a batch's cache entries after it has sent its answers: wait for
    them (the caller may already hold its answer)."""
    r = redis.Redis.from_url(settings.redis_url)
    mine = cache_keys(settings, account_id, texts)
    wait_for(lambda: r.exists(*mine) == len(mine), 10, "the cache entries stored", [])
    return mine


def test_identical_texts_are_computed_once_and_then_come_from_the_cache(
    worker, make_app, settings, account_factory
):
    client = make_app(
        anonymous_rate_limit="100000/minute", sync_timeout=30.0, cache_ttl=300
    ).test_client()
    account, key = account_factory("standard")
    t = tag()
    texts = [f"same {t}", f"other {t}", f"same {t}"]
    first = post(client, key, "embed", texts)
    assert first.status_code == 200 and first.json["cached"] is False
    results = first.json["results"]
    assert results[0]["embedding"] == results[2]["embedding"] != results[1]["embedding"]
    r = redis.Redis.from_url(settings.redis_url)
    mine = wait_stored(settings, account.id, texts)
    keys = r.keys("laneway:cache:*")
    # The worker stored each distinct text once, with the TTL.
    assert len(mine) == 2 and mine <= set(keys)
    assert 0 < r.ttl(next(iter(mine))) <= 300
    again = post(client, key, "embed", texts)
    assert again.status_code == 200 and again.json["cached"] is True
    assert again.json["results"] == results


def test_no_account_learns_that_another_sent_the_same_text(
    worker, make_app, settings, account_factory
):
    """The cache is per account: what A sent changes nothing B can observe, neither the
    `cached` flag nor an at-once 200 where B would otherwise get a 202 (Prefer: wait=0
    answers from the cache or not at all)."""
    client = make_app(
        anonymous_rate_limit="100000/minute", sync_timeout=30.0, cache_ttl=300
    ).test_client()
    (account_a, key_a), (account_b, key_b) = account_factory(), account_factory()
    t = tag()
    secret, unseen = [f"A's private text {t}"], [f"a text nobody sent {t}"]
    first = post(client, key_a, "embed", secret)
    assert first.status_code == 200 and first.json["cached"] is False
    wait_stored(settings, account_a.id, secret)
    assert post(client, key_a, "embed", secret).json["cached"] is True
    at_once = {"Prefer": "wait=0"}
    assert client.post("/v1/embed", json={"items": [{"id": "0", "text": secret[0]}]},
                       headers={**auth(key_a), **at_once}).status_code == 200  # fmt: skip
    # B, the same text and one nobody sent: answered alike, each as never seen.
    for texts in (secret, unseen):
        b = client.post("/v1/embed", json={"items": [{"id": "0", "text": texts[0]}]},
                        headers={**auth(key_b), **at_once})  # fmt: skip
        assert b.status_code == 202, (texts, b.json)
        answered = post(client, key_b, "embed", texts)
        assert answered.status_code == 200 and answered.json["cached"] is False
        assert "Server-Timing" in answered.headers  # the worker computed it
    wait_stored(settings, account_b.id, secret)
    # B's own repeat is B's to know.
    assert post(client, key_b, "embed", secret).json["cached"] is True


def test_an_operator_may_share_the_cache_across_accounts(make_app, settings, account_factory):
    from core.store.cache import ResultCache

    shared = {"anonymous_rate_limit": "100000/minute", "cache_ttl": 300, "cache_shared": True}
    client = make_app(**shared).test_client()
    (_, key_a), (_, key_b) = account_factory(), account_factory()
    text = f"shared by the operator's choice {tag()}"
    on = client.application.config["LANEWAY_SETTINGS"]
    cache = ResultCache(redis.Redis.from_url(on.redis_url), on).scoped("someone")
    cache.put(["embed"], [], [text], [{"embedding": [0.5]}])
    for key in (key_a, key_b):
        answer = post(client, key, "embed", [text])
        assert answer.status_code == 200 and answer.json["cached"] is True
        assert answer.json["results"][0]["embedding"] == [0.5]


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


def test_requests_go_to_a_live_gpu_interactive_worker_and_back_to_cpu_when_it_dies(
    worker, client, settings, account_factory, tmp_path
):
    """Each lane has its interactive queue and worker: with LANEWAY_INTERACTIVE_LANE=auto
    the web app sends to interactive.gpu while a worker serves it (here on the CPU
    fallback, pinned to device 0 as on a GPU host), and to interactive.cpu once it is gone."""
    import os
    import signal

    from db.models import Worker
    from tests.e2e.procs import wait_for
    from workers.registry import stopped

    _, key = account_factory("standard")
    t = tag()

    def classify(n, wait=30):
        return client.post(
            "/v1/classify",
            json={"items": [{"id": "1", "text": f"charged twice, refund me {n} {t}"}],
                  "labels": ["billing", "shipping"]},
            headers={**auth(key), "Prefer": f"wait={wait}"},
        )  # fmt: skip

    first = classify(0)
    assert first.status_code == 200 and first.json["lane"] == "cpu", first.json
    argv = [str(BIN / "laneway"), "worker", "interactive", "--lane", "gpu",
            "--name", "interactive-gpu-it"]  # fmt: skip
    gpu = start_worker("interactive-gpu-it", argv, tmp_path, env={"LANEWAY_GPU_FALLBACK": "cpu"})
    instance = None
    try:
        with session_scope() as session:
            row = session.scalars(
                select(Worker).where(Worker.hostname.startswith("interactive-gpu-it@"))
            ).one()
            instance = row.id
        # Registered on its queue alone, pinned to the first gpu device.
        assert [q for q in row.queues if "@" not in q] == ["interactive.gpu"]
        assert row.gpu_device == "0" and row.stopped_at is None
        n = iter(range(1, 1000))
        answered = wait_for(lambda: (r := classify(next(n))).json.get("lane") == "gpu" and r,
                            30, "a request answered on the gpu lane", [gpu])  # fmt: skip
        assert answered.status_code == 200
        assert answered.json["results"][0]["label"] == "billing"
        # Killed without a word: it stays registered until its heartbeats lapse.
        os.killpg(gpu.proc.pid, signal.SIGKILL)
        gpu.proc.wait()
        lost = classify("lost", wait=2)
        assert lost.status_code == 202, lost.json  # stored as a job: nothing lost
        # The miss sends the next request to the cpu lane at once, not after dead_after.
        back = classify("back")
        assert back.status_code == 200 and back.json["lane"] == "cpu", back.json
    finally:
        gpu.stop()
        # The rest of the run must not meet a dead worker that still looks alive for
        # `worker_dead_after` seconds (fresh web processes would try it once each).
        if instance is not None:
            stopped(instance, "killed by the test")


def _figures(client) -> dict[str, float]:
    """The interactive.cpu lane's figures on /metrics (every process's, added up)."""
    text = client.get("/metrics").text
    figures = {}
    for name in (
        "laneway_items_processed_total",
        "laneway_items_failed_total",
        "laneway_model_stage_seconds_count",
        "laneway_batch_size_sum",
        "laneway_batch_size_count",  # the last a batch records
    ):
        found = re.search(rf'^{name}{{lane="interactive\.cpu"}} (\S+)$', text, re.M)
        figures[name] = float(found.group(1)) if found else 0.0
    return figures


def _usage_items(settings) -> int:
    from webapp.jobviews import interactive_usage

    series, _ = interactive_usage(redis.Redis.from_url(settings.redis_url), settings)
    return sum(series["interactive.cpu"])


def test_each_batch_is_counted_in_metrics_and_the_lanes_usage(
    worker, client, settings, account_factory
):
    _, key = account_factory("standard")
    t = tag()
    before, items_before = _figures(client), _usage_items(settings)
    # Four items, three distinct texts: one model batch of three.
    texts = [f"alpha {t}", f"beta {t}", f"alpha {t}", f"gamma {t}"]
    assert post(client, key, "embed", texts).status_code == 200

    def recorded(name: str, added: float) -> dict[str, float]:
        # A batch is recorded once its answers are out: wait for it, never race it.
        def check() -> dict[str, float] | None:
            now = _figures(client)
            return now if now[name] >= before[name] + added else None

        return wait_for(check, 30, f"{name} + {added}", [worker])

    after = recorded("laneway_batch_size_count", 1)
    assert {name: after[name] - before[name] for name in after} == {
        "laneway_items_processed_total": 4,
        "laneway_items_failed_total": 0,
        "laneway_model_stage_seconds_count": 1,
        "laneway_batch_size_sum": 3,
        "laneway_batch_size_count": 1,
    }
    wait_for(lambda: _usage_items(settings) == items_before + 4, 30, "the lane's usage", [worker])

    poisoned = post(client, key, "embed", [f"fine {t}", f"{POISON_MARKER} {t}"])
    assert poisoned.status_code == 200
    after = recorded("laneway_items_failed_total", 1)
    assert after["laneway_items_processed_total"] == before["laneway_items_processed_total"] + 5


def _worker_state(settings) -> dict:
    from webapp.jobviews import live_workers

    with session_scope(settings) as session:
        workers = live_workers(session, settings)
    (found,) = [w for w in workers if w["hostname"].startswith("interactive-it@")]
    return {**found, "since": datetime.fromisoformat(found["since"])}


def test_the_dashboard_sees_the_interactive_worker_busy_then_idle(
    worker, client, settings, account_factory
):
    from core.util.faults import stall_file

    def state(busy: bool) -> dict:
        # Its heartbeat (every second here) carries the batcher's requests in flight.
        return wait_for(
            lambda: (s := _worker_state(settings))["busy"] is busy and s,
            30,
            "busy" if busy else "idle",
            [worker],
        )

    _, key = account_factory("standard")
    state(busy=False)
    stall = stall_file(settings)
    stall.touch()
    sent = datetime.now(UTC)
    try:
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(post, client, key, "embed", [f"held {STALL_MARKER} {tag()}"])
            busy = state(busy=True)
            assert sent <= busy["since"] <= datetime.now(UTC)
            released = datetime.now(UTC)
            stall.unlink()
            assert held.result(30).status_code == 200
        assert state(busy=False)["since"] >= released
    finally:
        stall.unlink(missing_ok=True)


def _stale_count(client) -> float:
    found = re.search(
        r'^laneway_interactive_stale_requests_total\{lane="interactive\.cpu"\} (\S+)$',
        client.get("/metrics").text,
        re.M,
    )
    return float(found.group(1)) if found else 0.0


def test_the_worker_drops_what_nobody_waits_for_and_survives_entries_that_are_not_requests(
    worker, client, settings
):
    """A request taken past its deadline (its caller already stored it as a job) is not
    computed; garbage on the list is skipped; the request behind both is answered."""
    from core.store import interactive_protocol as ia

    r = redis.Redis.from_url(settings.redis_url)
    t = tag()
    stale = ia.new_request(["embed"], [], [("s", f"too late {t}")], keep=False, account=1)
    stale.deadline = time.time() - 1
    fresh = ia.new_request(["embed"], [], [("f", f"in time {t}")], keep=False, account=1)
    before = _stale_count(client)
    r.rpush(ia.requests_key("cpu"), stale.encode(), b"not a request", b'{"id": 1}')
    answer = ia.send_and_wait(r, fresh, "cpu", 30)
    assert answer is not None and answer["status"] == ia.SUCCESS
    assert len(answer["output"][0]["embedding"]) == 384
    assert not r.exists(ia.reply_key(stale.id))
    wait_for(lambda: _stale_count(client) == before + 1, 30, "the stale request counted", [worker])


def test_a_request_sent_as_a_celery_message_is_answered_too(worker, settings):
    """A web process of the last release sent each request as a Celery message on the
    lane's queue: during a rolling upgrade the worker still answers those."""
    from core.queueing.celery_app import make_celery
    from core.store import interactive_protocol as ia

    r = redis.Redis.from_url(settings.redis_url)
    text = f"lovely, thanks {tag()}"
    req = ia.new_request(["score"], [], [("m", text)], keep=False, account=1)
    make_celery(settings).send_task(
        ia.TASK_NAME, args=[[req.message()]], queue="interactive.cpu", ignore_result=True
    )
    answer = ia.wait_answer(r, req.id, 30)
    assert answer is not None and answer["status"] == ia.SUCCESS, answer
    # The same text sent the current way gets the same rating: the old message is read
    # as the request it is, not merely answered.
    today = ia.send_and_wait(
        r, ia.new_request(["score"], [], [("m", text)], keep=False, account=1), "cpu", 30
    )
    assert today is not None and today["status"] == ia.SUCCESS, today
    (got,), (want,) = answer["output"], today["output"]
    assert got["id"] == "m" and got["rating"] == pytest.approx(want["rating"], abs=1e-4)
