"""Alerts to a Slack-compatible webhook: a deep queue, a dead letter, a failed job.

Each condition alerts at most once per `LANEWAY_ALERT_INTERVAL` seconds, across every
process (a Redis key with that expiry claims the slot). The message goes out from a task
on the maintenance queue (`laneway.send_alert`, tasks/alerts.py), with retries, so a slow
webhook never holds up a chunk; it is sent by name, from whichever room raises it.
"""

from __future__ import annotations

import logging

import redis

from core.config.settings import Settings, get_settings
from core.queueing.celery_app import sending_app
from core.queueing.result_backend import fire_and_forget
from core.store.redis_conn import redis_client

log = logging.getLogger(__name__)
SEND_ALERT = "laneway.send_alert"


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
        sending_app().send_task(SEND_ALERT, args=(condition, text))
    return True
