"""Input limits: each is a 4xx JSON answer naming the limit (and the line, for files)."""

from __future__ import annotations

import gzip
import io
import re
import time

import pytest
from sqlalchemy import func, select

from db.models import Job
from db.session import session_scope
from tests import bombs
from tests.integration.conftest import auth
from tests.integration.test_pages import _signed_in, _submit


def _upload(client, key, data: bytes, filename: str = "in.csv", **fields):
    return client.post(
        "/v1/jobs",
        data={"file": (io.BytesIO(data), filename), **fields},
        headers=auth(key),
        content_type="multipart/form-data",
    )


def jobs_of(account_id: int) -> int:
    with session_scope() as session:
        return session.scalar(select(func.count()).where(Job.account_id == account_id))


def _error(response, status: int, *parts: str) -> None:
    assert response.status_code == status, (response.status_code, response.data[:300])
    assert set(response.json) == {"error", "message"}
    for part in parts:
        assert part in response.json["message"], response.json["message"]


def test_items_per_job_follow_the_account_type(client, account_factory):
    _, demo = account_factory("demo")
    _, standard = account_factory("standard")
    items = [{"id": str(i), "text": "hello"} for i in range(101)]
    _error(
        client.post("/v1/jobs", json={"items": items}, headers=auth(demo)),
        400,
        "items[100]: more than 100 items",
        "LANEWAY_MAX_ITEMS_DEMO",
    )
    assert client.post("/v1/jobs", json={"items": items}, headers=auth(standard)).status_code == 202
    csv_rows = b"id,text\n" + b"".join(b"%d,hi\n" % i for i in range(101))
    _error(_upload(client, demo, csv_rows), 400, "line 102: more than 100 items")


def test_the_body_limit_follows_the_account_type_and_names_it(client, account_factory):
    _, demo = account_factory("demo")
    big = b"id,text\n" + b"1," + b"x" * (1 << 20) + b"\n"
    _error(
        _upload(client, demo, big),
        413,
        "larger than 1 MiB, the limit for demo accounts (LANEWAY_MAX_UPLOAD_BYTES_DEMO)",
    )
    _, trial = account_factory("trial")
    # Not the upload limit (the text is too long, a 400): the trial account may send 1 MiB.
    _error(_upload(client, trial, big), 400, "LANEWAY_MAX_TEXT_CHARS")


def test_the_fleet_wide_body_limit_applies_before_any_key(make_app):
    client = make_app(max_upload_bytes=1000, anonymous_rate_limit="1000/minute").test_client()
    # Without a key the API refuses before reading the body; a page reads it, and stops.
    response = client.post("/v1/jobs", data=b"x" * 2000, content_type="application/json")
    assert response.status_code == 401
    login = client.post("/login", data={"api_key": "x" * 2000})
    assert login.status_code == 413 and b"(LANEWAY_MAX_UPLOAD_BYTES)" in login.data


def test_a_huge_form_field_is_413_naming_the_fix(client, account_factory):
    _, key = account_factory()
    response = client.post(
        "/v1/jobs",
        data={"file": "id,text\n1,hello\n" * 40_000},  # a field, not a file part
        headers=auth(key),
        content_type="multipart/form-data",
    )
    _error(response, 413, "send the data as a file part")


@pytest.mark.parametrize(
    "filename,data,message",
    [
        ("in.csv", b"id,text\n1,ok\n2,\xff\xfe\n", "line 3: not valid UTF-8"),
        ("in.csv", b'id,text\n1,"unterminated\n', "malformed CSV"),
        ("in.csv", b"id,text\n,no id\n", "line 2: 'id' is missing or empty"),
        ("in.csv", b"id,text\n1,a\n2,b\n1,c\n", "line 4: duplicate id '1'"),
        ("in.csv", b"text\nhello\n", "line 1: the CSV header must name the columns"),
        ("in.jsonl", b'{"id": 1, "text": "a"}\n{"text": "b"}\n', "line 2: 'id' is missing"),
        ("in.jsonl", b'{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n', "line 2: duplicate"),
        ("in.jsonl", b'{"id": [1], "text": "a"}\n', "line 1: 'id' must be a string"),
        ("in.jsonl", b'{"id": "1", "text": 5}\n', "line 1: 'text' must be a string"),
        ("in.jsonl", b'{"id": "1", "text": "a"\n', "line 1: not valid JSON"),
        ("in.jsonl", b"\xef\xbb\xbf\xc3", "line 1: not valid UTF-8 (the file ends mid-character)"),
        ("in.jsonl", b"", "the job has no items"),
    ],
)
def test_file_problems_name_the_line(client, account_factory, filename, data, message):
    _, key = account_factory()
    _error(_upload(client, key, data, filename), 400, message)


@pytest.mark.parametrize(
    "body,message",
    [
        ({"items": "a, b"}, "'items' must be a list"),
        ({"items": [{"id": "1", "text": "a"}], "tasks": "classify"}, None),
        ({"items": [{"id": "1", "text": "a"}], "tasks": ["classify", "classify"]}, "twice"),
        ({"items": [{"id": "1", "text": "a"}], "task": "translate"}, "unknown task 'translate'"),
        ({"items": [{"id": "1", "text": "a"}], "labels": "x"}, "between 2 and 50"),
        ({"items": [{"id": "1", "text": "a"}], "labels": [1, 2]}, "list of strings"),
        ({"items": [{"id": 1.5, "text": "a"}]}, "'id' must be a string or an integer"),
        ({"items": [{"id": "1", "text": "a" * 20_001}]}, "LANEWAY_MAX_TEXT_CHARS"),
        ({"items": [{"id": "1", "text": "a"}], "priority": 1}, "unknown field 'priority'"),
    ],
)
def test_wrong_json_types_are_named(client, account_factory, body, message):
    _, key = account_factory()
    response = client.post("/v1/jobs", json=body, headers=auth(key))
    if message is None:
        assert response.status_code == 202  # a comma-separated string of tasks is accepted
    else:
        _error(response, 400, message)


def test_a_body_that_is_neither_json_nor_an_upload_is_415(client, account_factory):
    _, key = account_factory()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        response = client.post(
            "/v1/jobs", data=b'{"items": []}', headers=auth(key), content_type=content_type
        )
        _error(response, 415, "Content-Type: application/json")
    invalid = client.post(
        "/v1/jobs", data=b'{"items": "\xff"}', headers=auth(key), content_type="application/json"
    )
    _error(invalid, 400, "not valid UTF-8")


# --- compressed input costs what it would cost uncompressed -------------------------------

BROKEN_GZIP = [
    ("nested.csv.gz", bombs.nested(b"id,text\n1,a\n"), "gzip-compressed again"),
    ("tail.csv.gz", bombs.with_trailing_garbage(b"id,text\n1,a\n"), "not a valid gzip file"),
    ("cut.jsonl.gz", bombs.truncated(b'{"id": 1, "text": "a"}\n' * 50), "gzip file ends early"),
    ("plain.jsonl.gz", b'{"id": 1, "text": "a"}\n', "not a valid gzip file"),
]


def _items_past(limit: int) -> bytes:
    """Items whose JSON lines add up past `limit` bytes, within every other limit."""
    text = b"a" * 19_000
    return b"".join(b'{"id": "%d", "text": "%s"}\n' % (i, text) for i in range(limit // 19_000 + 2))


@pytest.mark.parametrize("name", sorted(bombs.NOTHING))
def test_a_gzip_upload_of_nothing_is_refused_quickly_through_the_api(client, account_factory, name):
    account, key = account_factory("demo")
    started = time.monotonic()
    response = _upload(client, key, bombs.nothing(name), name)
    assert time.monotonic() - started < 10
    _error(response, 400)
    assert re.search(r"LANEWAY_MAX_BLANK_LINES|LANEWAY_MAX_TEXT_CHARS", response.json["message"])
    assert jobs_of(account.id) == 0


def test_a_gzip_upload_is_held_to_the_body_limit_once_inflated(client, account_factory):
    account, demo = account_factory("demo")
    packed = gzip.compress(_items_past(1 << 20))
    assert len(packed) < 20_000  # far below the demo account's 1 MiB, as sent
    _error(
        _upload(client, demo, packed, "big.jsonl.gz"),
        400,
        "the gzip file inflates to more than 1048576 bytes",
        "LANEWAY_MAX_UPLOAD_BYTES_DEMO",
    )
    assert jobs_of(account.id) == 0
    # The trial account's limit is 8 MiB: the same file is its to send.
    _, trial = account_factory("trial")
    assert _upload(client, trial, packed, "big.jsonl.gz").status_code == 202


@pytest.mark.parametrize("name,data,message", BROKEN_GZIP, ids=bombs.stable_id)
def test_broken_gzip_uploads_are_400_naming_the_problem(
    client, account_factory, name, data, message
):
    _, key = account_factory()
    _error(_upload(client, key, data, name), 400, message)


def test_the_web_form_refuses_the_same_files_with_the_same_messages(app, account_factory):
    browser, account = _signed_in(app, account_factory, "demo")
    started = time.monotonic()
    refused = _submit(browser, {"file": (io.BytesIO(bombs.nothing("newlines.csv.gz")), "n.csv.gz")})
    assert time.monotonic() - started < 10
    assert refused.status_code == 400 and b"LANEWAY_MAX_BLANK_LINES" in refused.data
    big = {"file": (io.BytesIO(gzip.compress(_items_past(1 << 20))), "big.jsonl.gz")}
    refused = _submit(browser, big)
    assert refused.status_code == 400
    assert b"inflates to more than 1048576 bytes, the limit of LANEWAY_MAX_UPLOAD_BYTES_DEMO" in (
        refused.data
    )
    for name, data, message in BROKEN_GZIP:
        refused = _submit(browser, {"file": (io.BytesIO(data), name)})
        assert refused.status_code == 400 and message.encode() in refused.data, name
    assert jobs_of(account.id) == 0


def _chunked(client, path: str, key: str, body: bytes, content_type: str = "application/json"):
    """A body sent without a length, as a server (gunicorn) hands it over: terminated."""
    return client.post(
        path,
        input_stream=io.BytesIO(body),
        headers={**auth(key), "Transfer-Encoding": "chunked"},
        content_type=content_type,
        environ_overrides={"wsgi.input_terminated": True},
    )


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/embed", "/v1/embeddings"])
def test_a_body_without_a_length_past_the_limit_is_413_not_cut_off(client, account_factory, path):
    account, demo = account_factory("demo")
    fields = {"/v1/embeddings": b'{"model": "minilm", "input": ["hi"]}'}
    valid = fields.get(path, b'{"items": [{"id": "1", "text": "hi"}]}')
    before = jobs_of(account.id)

    def refused(response, *parts: str) -> None:
        if path != "/v1/embeddings":
            return _error(response, 413, *parts)
        assert response.status_code == 413, response.data[:300]  # OpenAI's error shape
        for part in parts:
            assert part in response.json["error"]["message"], response.json

    # Valid JSON up to the 1 MiB limit, then more: cut at the limit it would still parse.
    refused(
        _chunked(client, path, demo, valid + b" " * (2 << 20)),
        "larger than 1 MiB, the limit for demo accounts (LANEWAY_MAX_UPLOAD_BYTES_DEMO)",
    )
    refused(_chunked(client, path, demo, b" " * (64 << 20)), "larger than 1 MiB")
    assert jobs_of(account.id) == before
    if path == "/v1/jobs":  # under the limit, the same way: taken whole
        assert _chunked(client, path, demo, valid + b" " * 1000).status_code == 202


def test_an_upload_without_a_length_past_the_limit_is_413(client, account_factory):
    account, demo = account_factory("demo")
    boundary = "b0undary"
    part = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.csv"\r\n'
        "Content-Type: text/csv\r\n\r\n"
    ).encode()
    rows = b"id,text\n" + b"".join(b"%d,hello\n" % i for i in range(200_000))
    body = part + rows + f"\r\n--{boundary}--\r\n".encode()
    response = _chunked(
        client, "/v1/jobs", demo, body, content_type=f"multipart/form-data; boundary={boundary}"
    )
    _error(response, 413, "larger than 1 MiB")
    assert jobs_of(account.id) == 0


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"zz\r\nabc\r\n0\r\n\r\n", "Invalid chunk size"),
        (b"3\r\nabcXX0\r\n\r\n", "chunk terminator"),
        (b"3\r\nabc0\r\n\r\n", "chunk terminator"),
        (b"3;a\x01b\r\nabc\r\n0\r\n\r\n", "chunk extension"),
        (b"a\r\nabc", None),  # the body ends inside a chunk: Werkzeug's own 400
    ],
)
@pytest.mark.parametrize("path", ["/v1/embed", "/v1/embeddings", "/v1/jobs"])
def test_a_body_whose_chunked_framing_is_malformed_is_400(
    client, account_factory, path, raw, problem
):
    """gunicorn's own chunked reader over the raw bytes, as the server hands the body to
    the app: its framing errors are a 400 naming the problem, not a 500."""
    from gunicorn.http.body import Body, ChunkedReader
    from gunicorn.http.unreader import IterUnreader

    account, key = account_factory("demo")
    body = Body(ChunkedReader(object(), IterUnreader([raw])))
    response = client.post(
        path,
        headers={**auth(key), "Transfer-Encoding": "chunked"},
        content_type="application/json",
        environ_overrides={"wsgi.input": body, "wsgi.input_terminated": True},
    )
    assert response.status_code == 400, response.data[:300]
    message = response.json["message"] if path != "/v1/embeddings" else None
    message = message or response.json["error"]["message"]
    if problem is not None:
        assert "chunked framing is malformed" in message and problem in message, message
    assert jobs_of(account.id) == 0
