"""POST /v1/embeddings through a real interactive worker on the run's Redis and Postgres:
OpenAI's shapes, vectors and token counts equal to /v1/embed's, a long list split into
interactive requests, and every refusal in OpenAI's error shape (bad key, rate limit, bad
fields, too many inputs, no worker in time, a failing input); GET /v1/models and its
served names."""

from __future__ import annotations

import base64
import uuid

import numpy as np
import pytest

from core.vocab import POISON_MARKER
from inference.accuracy import TOLERANCE
from tests.e2e.procs import interactive_worker
from tests.integration.conftest import auth

pytestmark = pytest.mark.e2e


def same_text(a: list[float], b: list[float]) -> bool:
    """One text's vectors from two forwards agree as the precision promises: a reduced
    precision's products round with the rows beside them (bf16 on a CPU with AMX picks its
    kernel by the batch's rows), so a text alone and in a batch agree to the precision's
    cosine (inference/accuracy.py), not to the sixth decimal."""
    x, y = np.asarray(a), np.asarray(b)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))) >= TOLERANCE.cosine


@pytest.fixture(scope="module")
def worker(tmp_path_factory, settings, migrated):
    """One interactive worker for the module, its poison fault on."""
    env = {"LANEWAY_FAULTS": "poison", "LANEWAY_CACHE_TTL": "300"}
    logdir = tmp_path_factory.mktemp("openai")
    with interactive_worker(settings, logdir, "openai-it", env) as proc:
        yield proc


@pytest.fixture
def app(make_app):
    # Lists past 4 inputs go as several interactive requests; past 10 they are refused.
    return make_app(
        anonymous_rate_limit="100000/minute", sync_max_items=4, embeddings_max_inputs=10
    )


def tag() -> str:
    return uuid.uuid4().hex[:8]


def embeddings(client, key, **body):
    body.setdefault("model", "minilm")
    return client.post("/v1/embeddings", json=body, headers=auth(key))


def assert_openai_error(response, status, param, *needles):
    assert response.status_code == status, response.json
    error = response.json["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    for needle in needles:
        assert needle in error["message"], error
    return error


def test_float_and_base64_answers_match_embed(worker, client, account_factory):
    _, key = account_factory()
    texts = [f"where is my parcel {tag()}", f"I was charged twice {tag()}", "ok"]
    r = embeddings(client, key, input=texts)
    assert r.status_code == 200, r.json
    body = r.json
    assert (body["object"], body["model"]) == ("list", "minilm")
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert {d["object"] for d in body["data"]} == {"embedding"}
    ours = client.post(
        "/v1/embed",
        json={"items": [{"id": str(n), "text": t} for n, t in enumerate(texts)]},
        headers=auth(key),
    ).json["results"]
    # The same model on the same texts (padding in a micro-batch moves the 6th decimal).
    assert np.allclose(
        [d["embedding"] for d in body["data"]], [o["embedding"] for o in ours], atol=1e-5
    )
    tokens = sum(o["tokens"] for o in ours)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert ours[2]["tokens"] == 3  # [CLS] ok [SEP]
    b64 = embeddings(client, key, input=texts, encoding_format="base64").json
    for d, o in zip(b64["data"], ours, strict=True):
        vector = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
        assert vector.shape == (384,) and np.allclose(vector, o["embedding"], atol=1e-6)
    # One string is one input; the model may be named as Hugging Face does.
    one = embeddings(client, key, input=texts[0], model="sentence-transformers/all-MiniLM-L6-v2")
    assert one.status_code == 200 and len(one.json["data"]) == 1
    assert same_text(one.json["data"][0]["embedding"], ours[0]["embedding"])
    assert embeddings(client, key, input="x", dimensions=384).status_code == 200


def test_a_list_longer_than_a_sync_request_is_answered_inline_in_order(
    worker, client, account_factory
):
    _, key = account_factory()
    texts = [f"text number {n} {tag()}" for n in range(10)]  # three requests of 4, 4, 2
    r = embeddings(client, key, input=texts)
    assert r.status_code == 200, r.json
    assert [d["index"] for d in r.json["data"]] == list(range(10))
    alone = {n: embeddings(client, key, input=texts[n]).json["data"][0]["embedding"]
             for n in (0, 5, 9)}  # fmt: skip
    for n, vector in alone.items():
        got = r.json["data"][n]["embedding"]
        assert same_text(got, vector)
        assert max(alone, key=lambda m: np.dot(got, alone[m])) == n  # its own text's, in order
    r = embeddings(client, key, input=[f"t{n}" for n in range(11)])
    assert_openai_error(r, 400, "input", "11 texts", "at most 10", "LANEWAY_EMBEDDINGS_MAX_INPUTS")


def test_the_account_types_item_limit_applies_when_smaller(make_app, settings, account_factory):
    limits = dict(settings.account_limits)
    limits["demo"] = type(limits["demo"])("100/minute", 3, 1 << 20)
    client = make_app(account_limits=limits).test_client()
    _, key = account_factory("demo")
    r = embeddings(client, key, input=["a", "b", "c", "d"])
    assert_openai_error(r, 400, "input", "at most 3", "LANEWAY_MAX_ITEMS_DEMO")


def test_keys_and_rate_limits_as_the_rest_of_the_api(make_app, settings, account_factory):
    limits = dict(settings.account_limits)
    limits["demo"] = type(limits["demo"])("2/minute", 10, 1 << 20)
    client = make_app(account_limits=limits, anonymous_rate_limit="1000/minute").test_client()
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"}):
        r = client.post("/v1/embeddings", json={"input": "a", "model": "minilm"}, headers=headers)
        error = assert_openai_error(r, 401, None, "API key")
        assert error["type"] == "authentication_error" and r.headers["WWW-Authenticate"] == "Bearer"
    _, key = account_factory("demo")
    statuses = [embeddings(client, key, input="a", model="nope").status_code for _ in range(3)]
    assert statuses == [404, 404, 429]
    r = embeddings(client, key, input="a")
    error = assert_openai_error(r, 429, None, "LANEWAY_RATE_LIMIT_DEMO")
    assert error["type"] == "rate_limit_error" and int(r.headers["Retry-After"]) >= 1


@pytest.mark.parametrize(
    "body,status,param,needle",
    [
        ({"input": "a", "model": "gpt-4"}, 404, "model", "embedding models: "),
        ({"input": [1, 2, 3]}, 400, "input", "token ids"),
        ({"input": []}, 400, "input", "empty list"),
        ({"input": ["a", ""]}, 400, "input", "input[1]"),
        ({"input": "a", "dimensions": 256}, 400, "dimensions", "384-dimensional"),
        ({"input": "a", "encoding_format": "int8"}, 400, "encoding_format", "'float' or 'base64'"),
        ({"input": "a", "stream": True}, 400, None, "unknown field 'stream'"),
        ({"input": [{"text": "a"}]}, 400, "input", "input[0] must be a string"),
        ({"input": ["a", ["b"]]}, 400, "input", "token ids"),
        ({"input": "x" * 200_001}, 400, "input", "LANEWAY_MAX_TEXT_CHARS"),
        ({"input": "a", "model": None}, 400, "model", "'model' must be a string"),
        ({"input": "a", "dimensions": 0}, 400, "dimensions", "positive integer"),
        ({"input": "a", "dimensions": 1e400}, 400, "dimensions", "positive integer"),
    ],
)
def test_bad_requests_in_openai_shape(client, account_factory, body, status, param, needle):
    _, key = account_factory()
    r = embeddings(client, key, **body)
    error = assert_openai_error(r, status, param, needle)
    assert error["type"] == "invalid_request_error"


def test_not_json_and_broken_json(client, account_factory):
    _, key = account_factory()
    r = client.post("/v1/embeddings", data="input=a", headers=auth(key))
    assert_openai_error(r, 415, None, "application/json")
    r = client.post(
        "/v1/embeddings",
        data=b'{"input": "a",',
        headers={**auth(key), "Content-Type": "application/json"},
    )
    assert_openai_error(r, 400, None, "not a valid JSON object")


def test_no_answer_in_time_is_a_503_with_retry_after(client, account_factory, settings):
    import redis

    _, key = account_factory()
    queue = redis.Redis.from_url(settings.redis_url)
    before = queue.llen("interactive.cpu")
    r = client.post(
        "/v1/embeddings",
        json={"input": f"late {tag()}", "model": "minilm"},
        headers={**auth(key), "Prefer": "wait=0"},
    )
    error = assert_openai_error(r, 503, None, "LANEWAY_SYNC_MAX_WAIT", "POST /v1/jobs")
    assert error["type"] == "server_error" and r.headers["Retry-After"] == "1"
    assert queue.llen("interactive.cpu") == before  # nothing sent that nobody waits for


def test_an_input_the_model_fails_on_is_named(worker, client, account_factory):
    _, key = account_factory()
    r = embeddings(client, key, input=["fine", f"{POISON_MARKER} {tag()}"])
    assert_openai_error(r, 422, "input", "input[1] could not be embedded")


def test_a_body_shaped_to_exhaust_memory_is_a_413_in_openai_shape(client, account_factory):
    _, key = account_factory("enterprise")
    costly = b'{"input": [' + b",".join([b"[]"] * (2 << 20)) + b'], "model": "minilm"}'
    r = client.post(
        "/v1/embeddings", data=costly, headers={**auth(key), "Content-Type": "application/json"}
    )
    assert_openai_error(r, 413, None, "20 times its size plus 64 MiB")


def test_cached_answers_keep_their_token_counts(worker, make_app, account_factory):
    """With the result cache on (per account), a repeat comes from it with the same vectors
    and usage (the cache keeps `tokens` beside `embedding`), as another account's does."""
    client = make_app(anonymous_rate_limit="100000/minute", cache_ttl=300).test_client()
    (_, key), (_, other) = account_factory(), account_factory()
    texts = [f"cache me {tag()}", f"and me too {tag()}"]
    first = embeddings(client, key, input=texts).json
    again = embeddings(client, key, input=texts).json
    theirs = embeddings(client, other, input=texts).json
    assert first["usage"] == again["usage"] == theirs["usage"]
    assert first["usage"]["prompt_tokens"] > 4
    assert first["data"] == again["data"]


SERVED = ("laneway-embed", "text-embedding-3-small")
PUBLISHED = ["all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"]


def test_models_lists_every_name_embeddings_accepts(make_app, account_factory):
    client = make_app(anonymous_rate_limit="100000/minute", served_model_names=SERVED)
    client = client.test_client()
    _, key = account_factory()
    r = client.get("/v1/models", headers=auth(key))
    assert r.status_code == 200 and r.json["object"] == "list"
    assert [m["id"] for m in r.json["data"]] == ["minilm", *SERVED, *PUBLISHED]
    created = {m["created"] for m in r.json["data"]}
    assert len(created) == 1 and created.pop() > 1_500_000_000  # config.json's time, not 0
    for model in r.json["data"]:
        assert set(model) == {"id", "object", "created", "owned_by", "root"}
        assert (model["object"], model["owned_by"], model["root"]) == ("model", "laneway", "minilm")
        one = client.get(f"/v1/models/{model['id']}", headers=auth(key))
        assert one.status_code == 200 and one.json == model
    # Without served names, only the registry's and the published ones.
    plain = make_app(anonymous_rate_limit="100000/minute").test_client()
    ids = [m["id"] for m in plain.get("/v1/models", headers=auth(key)).json["data"]]
    assert ids == ["minilm", *PUBLISHED]


@pytest.mark.parametrize(
    "name",
    ["text-embedding-3-small", "gpt-4", "minilm/extra", "<script>alert(1)</script>", "MINILM"],
)
def test_an_unknown_model_is_a_404_in_openai_shape(client, account_factory, name):
    _, key = account_factory()
    r = client.get(f"/v1/models/{name}", headers=auth(key))
    error = assert_openai_error(r, 404, "model", "does not exist here", "models: minilm")
    assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
    assert r.content_type == "application/json"


def test_models_need_a_key_and_take_only_get(client, account_factory):
    for path in ("/v1/models", "/v1/models/minilm"):
        for headers in ({}, {"Authorization": "Bearer lw_nope"}):
            r = client.get(path, headers=headers)
            error = assert_openai_error(r, 401, None, "API key")
            assert error["type"] == "authentication_error"
    _, key = account_factory()
    r = client.post("/v1/models", json={"id": "mine"}, headers=auth(key))
    assert_openai_error(r, 405, None, "not allowed")
    assert set(r.headers["Allow"].split(", ")) == {"GET", "HEAD", "OPTIONS"}
    r = client.get("/v1/embeddings", headers=auth(key))  # a route with no GET
    assert_openai_error(r, 405, None, "not allowed")
    # No name at all: no route matches, and the error is still OpenAI's.
    assert_openai_error(client.get("/v1/models/", headers=auth(key)), 404, None)
    # A path that only begins like theirs is the rest of the API's.
    assert client.get("/v1/modelsx", headers=auth(key)).json["error"] == "not_found"


def test_a_served_name_embeds_with_the_registry_model(worker, make_app, account_factory):
    """An operator's served name runs the same model: the answer names the model that ran,
    its vectors keep their size whatever the name promises (384, not OpenAI's 1536)."""
    client = make_app(anonymous_rate_limit="100000/minute", served_model_names=SERVED)
    client = client.test_client()
    _, key = account_factory()
    text = f"my parcel is late {tag()}"
    named = embeddings(client, key, input=text, model="text-embedding-3-small").json
    plain = embeddings(client, key, input=text).json
    assert named["model"] == "minilm" and len(named["data"][0]["embedding"]) == 384
    assert np.allclose(named["data"][0]["embedding"], plain["data"][0]["embedding"], atol=1e-5)
    r = embeddings(client, key, input=text, model="text-embedding-3-small", dimensions=1536)
    assert_openai_error(r, 400, "dimensions", "384-dimensional", "1536")
