"""POSTing JSON to a webhook whose URL is a secret (Slack's carry a token in the path)."""

from __future__ import annotations

import logging
from typing import Any

import httpx

# httpx logs each request's URL at INFO; a webhook URL is a secret.
logging.getLogger("httpx").setLevel(logging.WARNING)


class WebhookError(RuntimeError):
    """The webhook did not take the message; the error never holds the URL."""


def post_json(url: str, body: dict[str, Any], timeout: float = 10.0) -> None:
    """POST `body`; raise WebhookError unless the webhook answers 2xx."""
    try:
        response = httpx.post(url, json=body, timeout=timeout)
    except httpx.HTTPError as exc:
        raise WebhookError(f"the webhook could not be reached ({type(exc).__name__})") from None
    if not response.is_success:
        raise WebhookError(f"the webhook answered {response.status_code}")
