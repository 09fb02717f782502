"""RabbitMQ for the tests that run the batch lanes on it: a vhost of its own per test, made
and deleted with rabbitmqctl (so runs never share queues), and the settings that name it.

The node is shared by every run on the machine (LANEWAY_TEST_RABBITMQ, guest on
127.0.0.1:5672 by default); a test that restarts it runs with the fault tests that restart
shared services, alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

RABBITMQ = os.environ.get("LANEWAY_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672")
USER = "guest"


def rabbitmqctl(*args: str, timeout: float = 60) -> str:
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not on PATH: the RabbitMQ tests need a local node")
    done = subprocess.run(
        ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=timeout
    )
    if done.returncode:
        pytest.fail(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip()}", pytrace=False)
    return done.stdout


@contextmanager
def vhost() -> Iterator[str]:
    """A fresh vhost for the test; yields the broker URL naming it."""
    name = f"laneway-test-{uuid.uuid4().hex[:10]}"
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, USER, ".*", ".*", ".*")
        yield f"{RABBITMQ}/{name}"
    finally:
        rabbitmqctl("delete_vhost", name)


@contextmanager
def on_rabbitmq(settings, monkeypatch) -> Iterator:
    """Settings whose batch lanes run on a fresh vhost: the test process sends through an
    app built from them, and every process the test starts inherits LANEWAY_BROKER_URL."""
    from core.queueing.celery_app import make_celery

    with vhost() as url:
        monkeypatch.setenv("LANEWAY_BROKER_URL", url)
        rabbit = settings.replace(broker_url=url)
        make_celery(rabbit)  # the process's default app: what dispatch sends through
        yield rabbit
