"""What an interactive message shows of itself on the real broker (Flower, the worker's
log): how many requests it carries, never their texts."""

from __future__ import annotations

import json

import redis

from laneway.celery_app import make_celery
from laneway.interactive_protocol import new_request
from webapp.interactive_client import send_message


def test_the_message_header_names_the_count_not_the_texts(settings):
    secret = "my card number is 4111 1111 1111 1111"
    requests = [
        new_request(["classify"], ["billing"], [("a", secret)], keep=False, account=1),
        new_request(["embed"], [], [("b", "a second text")], keep=False, account=1),
    ]
    queue = "interactive.cpu"
    r = redis.Redis.from_url(settings.redis_url)
    r.delete(queue)
    send_message(make_celery(settings), requests, "cpu", expires=5.0)
    (raw,) = r.lrange(queue, 0, -1)
    r.delete(queue)
    headers = json.loads(raw)["headers"]
    assert headers["task"] == "laneway.interactive"
    assert headers["argsrepr"] == "(2 interactive requests)" and headers["kwargsrepr"] == "{}"
    assert "4111" not in headers["argsrepr"] + headers["kwargsrepr"]
