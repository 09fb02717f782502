"""The JSON API in-process against the real Postgres and Redis (no worker consumes here)."""

import csv
import io
import json
import uuid

import pytest
import redis

from db.models import Chunk
from db.queries import upsert_results
from db.session import session_scope


@pytest.fixture
def app(settings, migrated):
    from webapp import create_app

    return create_app(settings)


@pytest.fixture
def client(app):
    return app.test_client()


def auth(key):
    return {"Authorization": f"Bearer {key}"}


ITEMS = [{"id": "a", "text": "my card was charged twice"}, {"id": "b", "text": "box arrived late"}]


def test_healthz(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json == {"status": "ok", "database": "ok", "redis": "ok"}


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer lw_deadbeef_nope", "Basic abc"])
def test_missing_or_wrong_key_is_401(client, header):
    headers = {"Authorization": header} if header else {}
    response = client.post("/v1/jobs", json={"items": ITEMS}, headers=headers)
    assert response.status_code == 401
    assert response.json["error"] == "unauthorized"
    assert response.headers["WWW-Authenticate"] == "Bearer"


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


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"json": {"items": []}}, "no items"),
        ({"json": {"task": "translate", "items": ITEMS}}, "unknown task"),
        ({"json": {"items": ITEMS, "labels": ["only"]}}, "labels"),
        ({"json": {"text": "hi"}}, "'items' is required"),
        ({"json": [1, 2]}, "JSON object"),
        ({"data": "not json", "content_type": "application/json"}, "JSON object"),
        (
            {
                "data": {"file": (io.BytesIO(b"id,text\n1,a\n1,b\n"), "x.csv")},
                "content_type": "multipart/form-data",
            },
            "line 3: duplicate id",
        ),
        (
            {"data": {"file": (io.BytesIO(b"x"), "x.pdf")}, "content_type": "multipart/form-data"},
            "unsupported file type",
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
    with session_scope(settings) as session:
        upsert_results(
            session,
            uuid.UUID(job_id),
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
