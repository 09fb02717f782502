"""RabbitMQ for the tests that run the batch lanes on it: a vhost of its own per test, made
and deleted with rabbitmqctl (so runs never share queues), and the settings that name it.

The node is shared by every run on the machine (LANEWAY_TEST_RABBITMQ, guest on
127.0.0.1:5672 by default) and never stopped by a test: a test that restarts its broker
starts a node of its own (`private_node`), so that it can run beside every other test."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

RABBITMQ = os.environ.get("LANEWAY_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672")
USER = "guest"
# RabbitMQ's own start script (Debian's `rabbitmq-server` on PATH wraps it and switches to
# the rabbitmq user, who cannot reach a test's temporary folder).
SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


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
    with vhost() as url:
        yield on_broker(url, settings, monkeypatch)


def on_broker(url: str, settings, monkeypatch):
    """Settings whose batch lanes run on the broker at `url`, which the test process sends
    through and every process the test starts inherits (LANEWAY_BROKER_URL)."""
    from core.queueing.celery_app import make_celery

    monkeypatch.setenv("LANEWAY_BROKER_URL", url)
    rabbit = settings.replace(broker_url=url)
    make_celery(rabbit)  # the process's default app: what dispatch sends through
    return rabbit


class Node:
    """A RabbitMQ node of one test's own (`private_node`): stopped and started as a
    service restart does, its data (durable queues and their messages) kept between."""

    def __init__(self, logdir: Path, home: Path, start_timeout: float):
        from tests.e2e.procs import free_port

        self.logdir, self.home, self.start_timeout = logdir, home, start_timeout
        self.port, dist = free_port(), free_port()
        self.name = f"laneway-test-{uuid.uuid4().hex[:10]}@localhost"
        self.url = f"amqp://{USER}:guest@127.0.0.1:{self.port}//"
        (home / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        self.env = {
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(dist),
            "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq.conf"),
            "RABBITMQ_MNESIA_BASE": str(home / "mnesia"),
            "RABBITMQ_LOG_BASE": str(home / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(home / "feature_flags"),
            "HOME": str(home),  # the node's Erlang cookie is written here, its own
        }
        self.proc = None
        self.starts = 0

    def start(self) -> None:
        """Start the node and wait until it takes AMQP connections."""
        from tests.e2e.procs import Proc

        self.starts += 1
        self.proc = Proc(f"rabbitmq-{self.starts}", [SERVER], self.logdir, self.env)
        deadline = time.monotonic() + self.start_timeout
        while not _answers(self.port):
            if not self.proc.alive():
                raise AssertionError(f"rabbitmq-server exited:\n{self.proc.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"rabbitmq-server did not listen in {self.start_timeout} s")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the whole node, as `systemctl stop rabbitmq-server` does (SIGTERM: the
        server script stops the node gracefully), and wait for it."""
        if self.proc is not None:
            self.proc.stop(self.start_timeout)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextmanager
def private_node(logdir: Path, start_timeout: float = 90) -> Iterator[Node]:
    """A RabbitMQ node of this test's own (RabbitMQ's own server script, as the machine's
    service runs it), on free loopback ports, its data, logs and Erlang cookie in a folder
    inside `logdir`: a test may stop and start it without touching any other run's broker
    or any file outside its own temporary folder. The node is stopped at the end, whatever
    happened."""
    if not Path(SERVER).exists():
        pytest.skip(f"{SERVER} is missing: this test starts a RabbitMQ node")
    home = logdir / "rabbitmq-node"
    home.mkdir()
    node = Node(logdir, home, start_timeout)
    try:
        node.start()
        yield node
    finally:
        node.stop()
