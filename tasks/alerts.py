"""The task that posts an alert to the Slack-compatible webhook (raised by
core/queueing/alerts.py), with retries, on the maintenance queue. The webhook URL carries its
secret in the path: it is never logged nor put in a message.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from core.queueing.celery_app import TRANSIENT_ERRORS, LanewayTask, app_settings
from core.util.webhooks import WebhookError, post_json

log = logging.getLogger(__name__)


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
    settings = app_settings()
    if not settings.alert_webhook_url:
        return {"condition": condition, "sent": False}
    post_to_webhook(settings.alert_webhook_url, text)
    log.info("alert %s sent", condition)
    return {"condition": condition, "sent": True}
