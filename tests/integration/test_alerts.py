"""Alerts against the real Redis and a real local HTTP receiver (no worker: the send task
runs in this process)."""

from __future__ import annotations

import pytest
import redis

from core.queueing.alerts import alert_key, raise_alert
from tasks.alerts import WebhookError, post_to_webhook, send_alert
from tests.receiver import Receiver


@pytest.fixture
def alerting(settings, worker_app):
    """Settings with a webhook, and the worker's Celery app built from them: the send task
    reads the settings of the app it runs in."""

    def make(url: str):
        configured = settings.replace(alert_webhook_url=url, alert_interval=60)
        worker_app(configured)
        return configured

    return make


def test_each_condition_alerts_once_per_interval(settings, alerting):
    r = redis.Redis.from_url(settings.redis_url)
    with Receiver() as hook:
        configured = alerting(hook.secret_url)
        r.delete(alert_key("depth:cpu"), alert_key("job_failed"))
        assert raise_alert("depth:cpu", "the cpu lane is deep", configured)
        assert not raise_alert("depth:cpu", "still deep", configured)  # within the interval
        assert raise_alert("job_failed", "job x failed", configured)  # another condition
        assert 55 <= r.ttl(alert_key("depth:cpu")) <= 60
        # The worker's side: the task posts Slack's body to the URL.
        send_alert.apply(args=("depth:cpu", "the cpu lane is deep")).get()
        assert hook.bodies == [{"text": "the cpu lane is deep"}]
        assert hook.paths == [f"/services/{hook.token}"]


def test_no_webhook_no_alert(settings):
    assert not raise_alert("dead_letter", "x", settings.replace(alert_webhook_url=""))


def test_a_failing_webhook_raises_without_its_url(settings):
    with Receiver(fail=1_000_000) as hook:
        with pytest.raises(WebhookError) as caught:
            post_to_webhook(hook.secret_url, "hello")
    assert "500" in str(caught.value) and hook.token not in str(caught.value)
    with pytest.raises(WebhookError) as caught:
        post_to_webhook(f"http://127.0.0.1:9/services/{hook.token}", "hello", timeout=2)
    assert hook.token not in str(caught.value)


def test_a_malformed_webhook_setting_is_refused_without_echoing_it():
    from core.config.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match="LANEWAY_ALERT_WEBHOOK_URL") as caught:
        Settings.from_env({"LANEWAY_ALERT_WEBHOOK_URL": "hooks.example/SECRET123"})
    assert "SECRET123" not in str(caught.value)
