"""The JSON API in-process against the real Postgres and Redis (no worker consumes here)."""

import csv
import io
import json
import uuid

import pytest
import redis

from db.models import Chunk
from db.session import session_scope
from tests.integration.conftest import auth, store_results

ITEMS = [{"id": "a", "text": "my card was charged twice"}, {"id": "b", "text": "box arrived late"}]


def test_healthz(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json == {"status": "ok", "database": "ok", "redis": "ok"}


def test_livez_answers_while_the_database_and_redis_do_not(make_app):
    # Nothing listens on port 1. A liveness probe that restarted web processes for this
    # would mend nothing; readiness (/healthz) takes them out of the load balancer instead.
    app = make_app(
        database_url="postgresql+psycopg://laneway@127.0.0.1:1/laneway",
        redis_url="redis://127.0.0.1:1/0",
    )
    client = app.test_client()
    assert client.get("/healthz").status_code == 503
    live = client.get("/livez")
    assert live.status_code == 200 and live.json == {"status": "alive"}


@pytest.mark.parametrize(
    "header",
    [None, "Bearer", "Bearer lw_deadbeef_nope", "Basic abc", "Bearer lw_\x00_nope", "Bearer é"],
)
def test_missing_or_wrong_key_is_401(client, header):
    headers = {"Authorization": header} if header else {}
    response = client.post("/v1/jobs", json={"items": ITEMS}, headers=headers)
    assert response.status_code == 401
    assert response.json["error"] == "unauthorized"
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert b"nope" not in response.data and b"abc" not in response.data  # never echoed


def test_json_submission_stores_job_and_queues_its_chunks(client, account_factory, settings):
    _, key = account_factory("standard")
    response = client.post(
        "/v1/jobs",
        json={"task": "classify", "items": ITEMS, "labels": ["x", "y"]},
        headers=auth(key),
    )
    assert response.status_code == 202, response.json
    body = response.json
    assert body["lane"] == "cpu" and body["status"] == "queued"
    assert response.headers["Location"] == body["links"]["self"] == f"/v1/jobs/{body['id']}"

    job = client.get(body["links"]["self"], headers=auth(key)).json
    assert job["progress"] == {"done": 0, "total": 2, "percent": 0.0}
    assert job["labels"] == ["x", "y"] and job["status"] == "queued"

    # The chunk's message sits in the cpu queue of the real broker, carrying its id only.
    with session_scope(settings) as session:
        chunk = session.query(Chunk).filter_by(job_id=uuid.UUID(body["id"])).one()
        task_id = chunk.task_id
    queued = redis.Redis.from_url(settings.redis_url).lrange("cpu", 0, -1)
    messages = [json.loads(m) for m in queued]
    mine = [m for m in messages if m["headers"]["id"] == task_id]
    assert len(mine) == 1 and mine[0]["headers"]["task"] == "laneway.run_chunk"


def test_large_standard_job_goes_to_the_gpu_lane(client, account_factory):
    _, key = account_factory("enterprise")
    items = [{"id": str(i), "text": f"text {i}"} for i in range(41)]
    assert client.post("/v1/jobs", json={"items": items}, headers=auth(key)).json["lane"] == "gpu"
    _, trial_key = account_factory("trial")
    assert (
        client.post("/v1/jobs", json={"items": items}, headers=auth(trial_key)).json["lane"]
        == "cpu"
    )


@pytest.mark.parametrize(
    "filename,data",
    [
        ("in.csv", b'id,text\n1,hello there\n2,"a, b"\n'),
        ("in.jsonl", b'{"id": "1", "text": "hello there"}\n{"id": 2, "text": "a, b"}\n'),
    ],
)
def test_file_upload(client, account_factory, filename, data):
    _, key = account_factory()
    response = client.post(
        "/v1/jobs",
        data={"file": (io.BytesIO(data), filename), "labels": "x,y"},
        headers=auth(key),
        content_type="multipart/form-data",
    )
    assert response.status_code == 202, response.json
    job = client.get(response.json["links"]["self"], headers=auth(key)).json
    assert (
        job["progress"]["total"] == 2 and job["labels"] == ["x", "y"] and job["source"] == "upload"
    )


def test_gzipped_and_large_uploads_stream_through_the_same_path(client, account_factory):
    """A .gz upload is read through gzip; a large one is spooled to disk by Werkzeug and
    read from there as its items are stored."""
    import gzip

    _, key = account_factory("standard")  # 4,000 items: past a trial account's 1,000
    lines = "".join(json.dumps({"id": f"n{i}", "text": "x" * 200}) + "\n" for i in range(4000))
    for name, data in (
        ("big.jsonl", lines.encode()),
        ("big.jsonl.gz", gzip.compress(lines.encode())),
    ):
        response = client.post(
            "/v1/jobs",
            data={"file": (io.BytesIO(data), name)},
            headers=auth(key),
            content_type="multipart/form-data",
        )
        assert response.status_code == 202, response.json
        job = client.get(response.json["links"]["self"], headers=auth(key)).json
        assert job["progress"]["total"] == 4000 and job["source"] == "upload"


def test_a_bad_line_anywhere_means_no_job(client, account_factory, settings):
    from sqlalchemy import func, select

    from db.models import Job

    account, key = account_factory()
    data = b"id,text\n" + b"".join(b"%d,fine text\n" % i for i in range(3000)) + b"3001,\n"
    response = client.post(
        "/v1/jobs",
        data={"file": (io.BytesIO(data), "late-error.csv")},
        headers=auth(key),
        content_type="multipart/form-data",
    )
    assert response.status_code == 400
    assert response.json["message"] == "line 3002: 'text' is empty"
    with session_scope(settings) as session:
        assert session.scalar(select(func.count()).where(Job.account_id == account.id)) == 0


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"json": {"items": []}}, "no items"),
        ({"json": {"task": "translate", "items": ITEMS}}, "unknown task"),
        ({"json": {"items": ITEMS, "labels": ["only"]}}, "labels"),
        ({"json": {"tasks": ["score"]}}, "'items' is required"),
        ({"json": {"items": ITEMS, "lables": ["x", "y"]}}, "unknown field 'lables'"),
        ({"json": [1, 2]}, "JSON object"),
        ({"data": "not json", "content_type": "application/json"}, "JSON object"),
        (
            {
                "data": {"file": (io.BytesIO(b"id,text\n1,a\n1,b\n"), "x.csv")},
                "content_type": "multipart/form-data",
            },
            "line 3: duplicate id '1' (first at line 2)",
        ),
        (
            {"json": {"items": [ITEMS[0], ITEMS[1], {"id": "a", "text": "again"}]}},
            "items[2]: duplicate id 'a' (first at items[0])",
        ),
        (
            {
                "data": {"file": (io.BytesIO(b'{"id": 1, "text": "a"}\n{oops\n'), "x.jsonl")},
                "content_type": "multipart/form-data",
            },
            "line 2: not valid JSON",
        ),
        (
            {"data": {"file": (io.BytesIO(b"x"), "x.pdf")}, "content_type": "multipart/form-data"},
            "unsupported file type",
        ),
        (
            {
                "data": {"file": (io.BytesIO(b"id,text\n1,a\n"), "x.csv.gz")},
                "content_type": "multipart/form-data",
            },
            "line 1: not a valid gzip file",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_problem(client, account_factory, kwargs, message):
    _, key = account_factory()
    response = client.post("/v1/jobs", headers=auth(key), **kwargs)
    assert response.status_code == 400
    assert response.json["error"] == "invalid_input"
    assert message in response.json["message"]


def test_another_accounts_job_is_404(client, account_factory):
    _, owner = account_factory()
    _, other = account_factory()
    job_id = client.post("/v1/jobs", json={"items": ITEMS}, headers=auth(owner)).json["id"]
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/results"):
        assert client.get(path, headers=auth(owner)).status_code == 200
        response = client.get(path, headers=auth(other))
        assert response.status_code == 404 and response.json["error"] == "not_found"
    assert client.get("/v1/jobs/not-a-uuid", headers=auth(owner)).status_code == 404


def test_results_stream_as_jsonl_and_csv(client, account_factory, settings):
    _, key = account_factory()
    job_id = client.post(
        "/v1/jobs", json={"items": ITEMS, "labels": ["x", "y"]}, headers=auth(key)
    ).json["id"]
    store_results(
        job_id,
        [
            {
                "idx": 0,
                "item_id": "a",
                "label": "x",
                "output": {"label": "x", "score": 0.5, "scores": {"x": 0.5, "y": 0.1}},
                "error": None,
            },
            {"idx": 1, "item_id": "b", "label": None, "output": None, "error": "boom"},
        ],
    )
    lines = client.get(f"/v1/jobs/{job_id}/results", headers=auth(key)).data.decode().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"id": "a", "label": "x", "score": 0.5, "scores": {"x": 0.5, "y": 0.1}},
        {"id": "b", "error": "boom"},
    ]
    response = client.get(f"/v1/jobs/{job_id}/results?format=csv", headers=auth(key))
    assert response.mimetype == "text/csv"
    rows = list(csv.reader(io.StringIO(response.data.decode())))
    assert rows == [
        ["id", "label", "score", "score:x", "score:y", "error"],
        ["a", "x", "0.5", "0.5", "0.1", ""],
        ["b", "", "", "", "", "boom"],
    ]
    assert client.get(f"/v1/jobs/{job_id}/results?format=xml", headers=auth(key)).status_code == 400


def test_unknown_route_and_method_answer_json(client):
    assert client.get("/v1/nothing").json["error"] == "not_found"
    assert client.delete("/healthz").status_code == 405


def test_submission_from_another_thread_uses_the_configured_celery_app(app, account_factory):
    # Web servers answer on many threads; Celery's current app is thread-local by default.
    import threading

    _, key = account_factory()
    answers = []

    def post():
        answers.append(app.test_client().post("/v1/jobs", json={"items": ITEMS}, headers=auth(key)))

    thread = threading.Thread(target=post)
    thread.start()
    thread.join()
    assert answers[0].status_code == 202, answers[0].json


def test_lone_surrogates_and_deep_nesting_are_400_not_500(client, account_factory):
    _, key = account_factory()
    body = b'{"items": [{"id": "a", "text": "x\\ud800"}]}'
    response = client.post(
        "/v1/jobs", data=body, content_type="application/json", headers=auth(key)
    )
    assert response.status_code == 400 and "invalid character" in response.json["message"]
    deep = b'{"items": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    response = client.post(
        "/v1/jobs", data=deep, content_type="application/json", headers=auth(key)
    )
    assert response.status_code == 400


def test_cancel_skips_chunks_not_started_and_ends_the_job(client, account_factory, settings):
    _, key = account_factory("standard")
    job = client.post("/v1/jobs", json={"items": ITEMS}, headers=auth(key)).json
    other_key = account_factory("standard")[1]
    assert client.delete(job["links"]["self"], headers=auth(other_key)).status_code == 404

    response = client.delete(job["links"]["self"], headers=auth(key))
    assert response.status_code == 202
    body = response.json
    # Nothing had started: the job ends at once, every item cancelled, none failed.
    assert body["status"] == "cancelled"
    assert body["counts"] == {"succeeded": 0, "failed": 0, "cancelled": 2}
    with session_scope(settings) as session:
        states = {c.state for c in session.query(Chunk).filter_by(job_id=uuid.UUID(job["id"]))}
    assert states == {"cancelled"}

    again = client.delete(job["links"]["self"], headers=auth(key))
    assert again.status_code == 409 and again.json["error"] == "conflict"
    assert "already ended (cancelled)" in again.json["message"]


def test_retry_and_dead_letters_of_a_job_without_any(client, account_factory):
    _, key = account_factory("standard")
    job = client.post("/v1/jobs", json={"items": ITEMS}, headers=auth(key)).json
    letters = client.get(job["links"]["dead_letters"], headers=auth(key))
    assert letters.status_code == 200 and letters.json == {"dead_letters": []}
    retry = client.post(job["links"]["retry"], headers=auth(key))
    assert retry.status_code == 409 and "no dead letters" in retry.json["message"]
    other_key = account_factory("standard")[1]
    assert client.post(job["links"]["retry"], headers=auth(other_key)).status_code == 404
    assert client.get(job["links"]["dead_letters"], headers=auth(other_key)).status_code == 404


def test_jobs_wait_for_a_slot_and_past_the_hold_limit_answer_503(settings, account_factory):
    from webapp import create_app

    _, key = account_factory("trial")
    # One chunk in flight on the cpu lane at most: the first job's takes the slot.
    tight = create_app(settings.replace(lane_limit_cpu=1, hold_limit=10, reconcile_interval=40))
    client = tight.test_client()
    first = client.post("/v1/jobs", json={"items": ITEMS}, headers=auth(key))
    second = client.post("/v1/jobs", json={"items": ITEMS}, headers=auth(key))
    assert first.status_code == second.status_code == 202
    assert first.json["status"] == second.json["status"] == "queued"
    waiting = {
        json.loads(m)["headers"]["id"]
        for m in redis.Redis.from_url(settings.redis_url).lrange("cpu", 0, -1)
    }
    with session_scope(settings) as session:
        sent, held = (
            session.query(Chunk).filter_by(job_id=uuid.UUID(r.json["id"])).one()
            for r in (first, second)
        )
        assert (sent.state, held.state) == ("queued", "held")
        assert sent.task_id in waiting and held.task_id not in waiting  # held: not sent

    # Ten items may wait: nine more beside the two waiting are refused, and not stored.
    too_many = [{"id": str(i), "text": f"text {i}"} for i in range(9)]
    refused = client.post("/v1/jobs", json={"items": too_many}, headers=auth(key))
    assert refused.status_code == 503
    assert refused.json["error"] == "lane_full" and "the cpu lane" in refused.json["message"]
    # Two reconciler rounds (80 s); Flask-Limiter re-renders it, whole seconds from now.
    assert 79 <= int(refused.headers["Retry-After"]) <= 80
    # Eight fit.
    assert (
        client.post("/v1/jobs", json={"items": too_many[:8]}, headers=auth(key)).status_code == 202
    )
    for response in (first, second):
        client.delete(response.json["links"]["self"], headers=auth(key))


def test_lanes_count_delivered_messages_and_keda_reads_the_gpu_depth(client, settings):
    """`GET /lanes` counts a message a worker took (kombu's `unacked`) as depth: the number
    the KEDA manifest in deploy/k8s scales gpu workers on."""
    from pathlib import Path

    import yaml

    from core.queueing.broker import UNACKED, UNACKED_INDEX

    r = redis.Redis.from_url(settings.redis_url)
    tag = f"test-{uuid.uuid4().hex}"
    message = {"headers": {"id": tag, "task": "laneway.model_chunk"}}
    before = client.get("/lanes").json["gpu"]
    r.hset(UNACKED, tag, json.dumps([message, "", "gpu"]))
    r.zadd(UNACKED_INDEX, {tag: 0})
    try:
        after = client.get("/lanes").json["gpu"]
    finally:
        r.hdel(UNACKED, tag)
        r.zrem(UNACKED_INDEX, tag)
    assert after["queued"] == before["queued"]  # a bare list length sees nothing
    assert after["delivered"] == before["delivered"] + 1
    assert after["depth"] == after["queued"] + after["delivered"]

    manifest = Path(__file__).parents[2] / "deploy" / "k8s" / "gpu-workers.yaml"
    scaled = [d for d in yaml.safe_load_all(manifest.read_text()) if d["kind"] == "ScaledObject"]
    trigger = scaled[0]["spec"]["triggers"][0]
    assert trigger["type"] == "metrics-api" and trigger["metadata"]["url"].endswith("/lanes")
    lane, key = trigger["metadata"]["valueLocation"].split(".")
    assert isinstance(client.get("/lanes").json[lane][key], int)
    assert scaled[0]["spec"]["minReplicaCount"] == 0


def test_csv_export_neutralizes_formulas_and_keeps_numbers(client, account_factory, settings):
    _, key = account_factory()
    items = [{"id": '=HYPERLINK("http://x")', "text": "a"}, {"id": "-5", "text": "b"}]
    job_id = client.post(
        "/v1/jobs",
        json={"items": items, "tasks": ["classify", "score"], "labels": ["@risk", "+1"]},
        headers=auth(key),
    ).json["id"]
    output = {"label": "@risk", "score": 0.6, "scores": {"@risk": 0.6, "+1": -0.2}, "rating": -0.75}
    store_results(
        job_id,
        [
            {
                "idx": 0,
                "item_id": items[0]["id"],
                "label": "@risk",
                "output": output,
                "error": None,
            },
            {"idx": 1, "item_id": "-5", "label": None, "output": None, "error": "-boom"},
        ],
    )
    response = client.get(f"/v1/jobs/{job_id}/results?format=csv", headers=auth(key))
    rows = list(csv.reader(io.StringIO(response.data.decode())))
    assert rows == [
        ["id", "label", "score", "score:@risk", "score:+1", "rating", "error"],
        ['\'=HYPERLINK("http://x")', "'@risk", "0.6", "0.6", "-0.2", "-0.75", ""],
        ["-5", "", "", "", "", "", "'-boom"],
    ]
    # JSONL is data, not a spreadsheet: it keeps the values as they are.
    first = json.loads(
        client.get(f"/v1/jobs/{job_id}/results", headers=auth(key)).data.split(b"\n")[0]
    )
    assert first["id"] == items[0]["id"] and first["label"] == "@risk"
