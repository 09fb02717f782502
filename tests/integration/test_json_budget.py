"""Every JSON endpoint refuses a body shaped to cost far more memory to parse than its size
(413, naming the bound) before parsing it; an ordinary body of the same size is taken."""

from __future__ import annotations

import pytest

from tests.integration.conftest import auth
from webapp.jsonbudget import MIB

SIZE = 6 * MIB


def _costly(field: str) -> bytes:
    n = SIZE // 3
    return b'{"%s": [' % field.encode() + b",".join([b"{}"] * n) + b"]}"


@pytest.mark.parametrize(
    "method,path,field",
    [
        ("post", "/v1/jobs", "items"),
        ("post", "/v1/embed", "items"),
        ("post", "/v1/inference", "items"),
        ("post", "/v1/admin/accounts", "name"),
    ],
)
def test_a_body_of_tiny_values_is_a_413_before_parsing(
    client, account_factory, method, path, field
):
    _, key = account_factory("enterprise", is_admin=True)
    response = getattr(client, method)(
        path, data=_costly(field), headers={**auth(key), "Content-Type": "application/json"}
    )
    assert response.status_code == 413, response.json
    assert response.json["error"] == "body_too_complex"
    assert "20 times its size plus 64 MiB" in response.json["message"]
    assert ".jsonl" in response.json["message"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_the_admin_api_refuses_it_whatever_the_content_type(client, account_factory, content_type):
    # The admin API reads its body as JSON whatever the Content-Type says.
    _, key = account_factory("enterprise", is_admin=True)
    headers = {**auth(key), **({"Content-Type": content_type} if content_type else {})}
    response = client.post("/v1/admin/accounts", data=_costly("name"), headers=headers)
    assert response.status_code == 413 and response.json["error"] == "body_too_complex"


def test_without_a_key_the_body_is_not_read(client):
    response = client.post("/v1/jobs", data=_costly("items"), content_type="application/json")
    assert response.status_code == 401


def test_an_ordinary_body_of_that_size_is_parsed(client, account_factory):
    _, key = account_factory("enterprise")
    text = "my parcel arrived two weeks late, the box was crushed and nobody answers: %d"
    items = [{"id": str(n), "text": text % n} for n in range(SIZE // 100)]
    # An unknown field, found once the body is parsed: the answer shows it was parsed
    # (no 413), and no job of 60,000 chunks fills the test broker's queue.
    response = client.post("/v1/jobs", json={"items": items, "x": 1}, headers=auth(key))
    assert response.status_code == 400 and "unknown field 'x'" in response.json["message"]
