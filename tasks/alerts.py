"""Alerts to a Slack-compatible webhook: a deep queue, a dead letter, a failed job.

Each condition alerts at most once per `LANEWAY_ALERT_INTERVAL` seconds, across every
process (a Redis key with that expiry claims the slot). The message goes out from a task
on the maintenance queue, with retries, so a slow webhook never holds up a chunk. The
webhook URL carries its secret in the path: it is never logged nor put in a message.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery import shared_task

from laneway.redis_conn import redis_client
from laneway.settings import Settings, get_settings
from laneway.webhooks import WebhookError, post_json
from tasks.backend import fire_and_forget
from tasks.base import TRANSIENT_ERRORS, LanewayTask

log = logging.getLogger(__name__)


def alert_key(condition: str) -> str:
    return f"laneway:alert:{condition}"


def raise_alert(condition: str, text: str, settings: Settings | None = None) -> bool:
    """Send `text` unless `condition` already alerted within the interval; True if sent."""
    settings = settings or get_settings()
    if not settings.alert_webhook_url:
        return False
    try:
        claimed = redis_client(settings).set(
            alert_key(condition), text[:200], nx=True, ex=settings.alert_interval
        )
    except redis.RedisError as exc:
        log.warning("alert %s not sent: Redis unavailable (%s)", condition, type(exc).__name__)
        return False
    if not claimed:
        return False
    with fire_and_forget():
        send_alert.apply_async(args=(condition, text))
    return True


def post_to_webhook(url: str, text: str, timeout: float = 10.0) -> None:
    """POST `{"text": ...}`, the body Slack's incoming webhooks (and compatibles) take."""
    post_json(url, {"text": text}, timeout=timeout)


@shared_task(
    name="laneway.send_alert",
    base=LanewayTask,
    autoretry_for=(*TRANSIENT_ERRORS, WebhookError),
    max_retries=5,
)
def send_alert(condition: str, text: str) -> dict[str, Any]:
    settings = get_settings()
    if not settings.alert_webhook_url:
        return {"condition": condition, "sent": False}
    post_to_webhook(settings.alert_webhook_url, text)
    log.info("alert %s sent", condition)
    return {"condition": condition, "sent": True}
