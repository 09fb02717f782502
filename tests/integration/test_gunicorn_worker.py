"""`laneway web`'s gunicorn worker (webapp/gunicorn_worker.py) under a real gunicorn, on
real sockets: a kept-alive connection's next request, sent at once, is served by the thread
that answered the last one; one sent later, or while most threads are serving, goes
through gunicorn's poller as before; every request is answered either way."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from webapp.gunicorn_worker import LINGER

pytestmark = pytest.mark.slow  # starts gunicorn

APP = """
import os, threading, time

def app(environ, start_response):
    if environ["PATH_INFO"] == "/hold":  # answered once the test makes the file
        here = os.path.dirname(__file__)
        open(os.path.join(here, f"entered-{threading.get_ident()}"), "w").close()
        release = os.path.join(here, "release")
        while not os.path.exists(release):
            time.sleep(0.01)
    if environ["PATH_INFO"] == "/read":  # the body read to its end
        environ["wsgi.input"].read()
    body = str(threading.get_ident()).encode()
    if environ["PATH_INFO"] == "/smuggled":
        body = b"smuggled"
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
"""
LINGERED = "on the thread that answered"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path: Path):
    (tmp_path / "app.py").write_text(APP)
    port = free_port()
    log = tmp_path / "gunicorn.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}",
             "--workers", "1", "--threads", "8", "--worker-class",
             "webapp.gunicorn_worker.Worker", "--log-level", "debug",
             "--chdir", str(tmp_path), "app:app"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        yield port, log, tmp_path
    finally:
        (tmp_path / "release").touch()
        proc.terminate()
        proc.wait(30)


def get(conn: http.client.HTTPConnection, path: str = "/") -> str:
    conn.request("GET", path)
    response = conn.getresponse()
    assert response.status == 200
    return response.read().decode()


def lingered(log: Path) -> int:
    return log.read_text().count(LINGERED)


def test_laneway_web_runs_this_worker():
    from webapp import gunicorn_hooks  # what `laneway web` passes as gunicorn's --config

    assert gunicorn_hooks.worker_class == "webapp.gunicorn_worker.Worker"


def test_the_next_request_sent_at_once_is_served_by_the_same_thread(server):
    port, log, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    threads = {get(conn) for _ in range(5)}
    assert len(threads) == 1  # one thread served them all
    assert lingered(log) == 4  # the first came through the poller, the rest did not
    conn.close()
    # A connection closed while its thread waits: the next caller is served as ever.
    other = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    assert get(other)
    other.close()
    assert "Traceback" not in log.read_text()


def test_a_request_sent_after_the_wait_goes_through_the_poller(server):
    port, log, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    get(conn)
    time.sleep(20 * LINGER)  # the gap under test: longer than a thread waits
    get(conn)
    assert lingered(log) == 0
    conn.close()


def test_no_thread_waits_on_its_connection_while_a_quarter_of_the_threads_serve(server):
    """Eight threads, two held by requests that have not been answered: a third serves
    its connection's requests one at a time, through the poller, and answers each."""
    port, log, folder = server
    held = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(2)]
    for conn in held:
        conn.request("GET", "/hold")
    deadline = time.monotonic() + 10
    while len(list(folder.glob("entered-*"))) < 2:  # both held in the app: two threads busy
        assert time.monotonic() < deadline
        time.sleep(0.01)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(3):
        assert get(conn)
    assert lingered(log) == 0
    (folder / "release").touch()
    for waiting in held:
        assert waiting.getresponse().status == 200
        waiting.close()
    conn.close()


def test_a_connection_past_descriptor_1024_is_waited_on_too():
    """select() refuses descriptors from 1024 on, which a busy worker's connections reach;
    the wait polls, so such a connection's next request is still seen."""
    import fcntl
    import resource
    from types import SimpleNamespace

    from webapp.gunicorn_worker import Worker

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1100:
        pytest.skip(f"descriptors are limited to {hard} here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    ours, theirs = socket.socketpair()
    high = socket.socket(fileno=fcntl.fcntl(ours.fileno(), fcntl.F_DUPFD, 1100))  # a free one
    assert high.fileno() >= 1024
    try:
        conn = SimpleNamespace(sock=high)
        assert not Worker.arrives(conn)  # nothing sent: the wait lapses
        theirs.sendall(b"GET / HTTP/1.1\r\n")
        assert Worker.arrives(conn)
    finally:
        high.close()
        ours.close()
        theirs.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def post(conn: http.client.HTTPConnection, path: str, body: bytes, **headers: str) -> str:
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    assert response.status == 200
    return response.read().decode()


SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("path", ["/ignore", "/read"])
def test_a_kept_alive_connection_s_next_request_starts_after_the_body_read_or_not(server, path):
    """A body the app left unread is drained before the next request is parsed, also on
    the thread that answered (else its bytes, here a whole request, would be taken for the
    next one); one read to its end leaves nothing to drain. Either way the next request is
    the one the caller sent."""
    port, log, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(3):
        assert post(conn, path, SMUGGLED) != "smuggled"
        assert get(conn) != "smuggled"
    assert post(conn, path, SMUGGLED * 1000) != "smuggled"  # longer than one read
    assert get(conn) != "smuggled"
    conn.close()
    assert "smuggled" not in log.read_text()
    assert "Traceback" not in log.read_text()
