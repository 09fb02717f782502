"""Slow clients against a real nginx (docker/nginx/laneway.conf.template, as deployed) in
front of a real `laneway web`: hundreds of connections that send part of a request and
stall take no gunicorn thread, other clients are served promptly, and the proxy cuts the
stalled ones at its timeouts. Without the proxy, a few such clients take every thread."""

from __future__ import annotations

import os
import shutil
import socket
import string
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.config.settings import Settings
from core.vocab import ACCOUNT_TYPES
from tests.e2e.procs import Proc, free_port, start_web, wait_for

# Debian's nginx is in /usr/sbin, which a user's PATH may lack.
NGINX = shutil.which("nginx", path=f"{os.environ.get('PATH', '')}:/usr/sbin")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(NGINX is None, reason="no nginx (`make test` installs it)"),
]

TEMPLATE = Path(__file__).parents[2] / "docker" / "nginx" / "laneway.conf.template"
# Few gunicorn threads, many more stalled clients: the proxy must make the count moot.
WEB_ENV = {"LANEWAY_WEB_WORKERS": "1", "LANEWAY_WEB_THREADS": "4"}
STALLED = 200
HEADER_TIMEOUT, BODY_TIMEOUT = 10, 20  # client_header_timeout, client_body_timeout
SLACK = 15  # a loaded 2-core machine


def largest_upload(settings: Settings) -> int:
    return max(settings.limits_for(kind).max_upload_bytes for kind in ACCOUNT_TYPES)


# As root, nginx would look up a user for its workers (`nobody`) and they could not reach
# pytest's private folders: it runs as this unprivileged uid instead, in a folder it owns.
UNPRIVILEGED = 65534


@pytest.fixture
def nginx_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="laneway-nginx-"))
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (root / sub).mkdir()
    if os.geteuid() == 0:
        for path in (root, *root.iterdir()):
            os.chown(path, UNPRIVILEGED, UNPRIVILEGED)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def start_proxy(root: Path, logdir: Path, upstream: str) -> tuple[Proc, str]:
    """nginx in the foreground with the deployed server block and this test's paths."""
    port = free_port()
    server = string.Template(TEMPLATE.read_text()).safe_substitute(
        LANEWAY_PROXY_UPSTREAM=upstream,
        LANEWAY_PROXY_LISTEN=f"127.0.0.1:{port}",
        LANEWAY_PROXY_MAX_BODY=str(largest_upload(Settings.from_env({}))),
    )
    (root / "laneway.conf").write_text(server)
    temp = "".join(f"{kind}_temp_path {root / kind};\n" for kind in ("fastcgi", "uwsgi", "scgi"))
    (root / "nginx.conf").write_text(
        f"worker_processes 1;\npid {root / 'nginx.pid'};\nerror_log {root / 'error.log'} info;\n"
        "events { worker_connections 2048; }\n"
        f"http {{\naccess_log {root / 'access.log'};\nclient_body_temp_path {root / 'body'};\n"
        f"proxy_temp_path {root / 'proxy'};\n{temp}include {root / 'laneway.conf'};\n}}\n"
    )
    drop = ["setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups"]
    argv = [*(drop if os.geteuid() == 0 else []), NGINX, "-p", str(root),
            "-e", str(root / "error.log"), "-c", str(root / "nginx.conf")]  # fmt: skip
    checked = subprocess.run([*argv, "-t"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    proc = Proc("nginx", [*argv, "-g", "daemon off;"], logdir)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers(url), 30, "nginx to answer", [proc])
    return proc, url


def answers(url: str, timeout: float = 5) -> bool:
    try:
        return httpx.get(f"{url}/livez", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def stall(url: str, n: int, body: bool) -> list[socket.socket]:
    """n connections that send part of a request and go quiet: half of the headers, or
    the headers and 10 of the 1000 bytes of body they announce."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    partial = b"POST /v1/jobs HTTP/1.1\r\nHost: laneway\r\nContent-Type: application/json\r\n"
    if body:
        partial += b"Content-Length: 1000\r\n\r\n" + b'{"items": '
    sockets = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(partial)
        sockets.append(s)
    return sockets


def cut(s: socket.socket) -> bool:
    """True once the other end closed (or reset) the connection."""
    s.setblocking(False)
    try:
        while data := s.recv(65536):
            del data  # a 408 page before the close
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def read_until_closed(s: socket.socket) -> bytes:
    """What the other end sent before it closed; nginx resets a connection whose body it
    refused to read, after its answer."""
    received = []
    try:
        while data := s.recv(65536):
            received.append(data)
    except ConnectionResetError:
        pass
    return b"".join(received)


def close_all(sockets: list[socket.socket]) -> None:
    for s in sockets:
        s.close()


def served_promptly(url: str, times: int = 5, within: float = 5.0) -> list[float]:
    """Seconds each of `times` ordinary requests took; each must answer within `within`."""
    took = []
    for _ in range(times):
        start = time.monotonic()
        response = httpx.get(f"{url}/livez", timeout=within)
        assert response.status_code == 200
        took.append(time.monotonic() - start)
    return took


def test_stalled_clients_do_not_starve_the_web_app_behind_the_proxy(tmp_path, nginx_dir):
    web, web_url = start_web(tmp_path, WEB_ENV)
    proxy, url = start_proxy(nginx_dir, tmp_path, web_url.removeprefix("http://"))
    heads, bodies = [], []
    try:
        heads = stall(url, STALLED // 2, body=False)
        bodies = stall(url, STALLED // 2, body=True)
        took = served_promptly(url)
        assert max(took) < 5, took
        # The proxy cuts them: headers after client_header_timeout, bodies after
        # client_body_timeout (it may answer 408 first, then closes).
        wait_for(lambda: all(cut(s) for s in heads), HEADER_TIMEOUT + SLACK,
                 "nginx to cut the clients stalled in their headers", [proxy, web])  # fmt: skip
        wait_for(lambda: all(cut(s) for s in bodies), BODY_TIMEOUT + SLACK,
                 "nginx to cut the clients stalled in their bodies", [proxy, web])  # fmt: skip
        served_promptly(url)
        # A body over the proxy's limit is refused at once, in JSON, before it is sent.
        too_big = largest_upload(Settings.from_env({})) + 1
        (refused,) = stall(url, 1, body=False)
        with refused:
            refused.sendall(f"Content-Length: {too_big}\r\n\r\n".encode())
            answer = read_until_closed(refused).decode()
        assert answer.startswith("HTTP/1.1 413"), answer
        assert '"error": "request_entity_too_large"' in answer
    finally:
        close_all(heads + bodies)
        proxy.stop()
        web.stop()


def test_without_the_proxy_a_few_stalled_clients_take_every_thread(tmp_path):
    """The contrast: gunicorn's threads each wait on one stalled client."""
    web, web_url = start_web(tmp_path, WEB_ENV)
    stalled = []
    try:
        assert answers(web_url)
        stalled = stall(web_url, 2 * int(WEB_ENV["LANEWAY_WEB_THREADS"]), body=False)
        assert not answers(web_url, timeout=5), "gunicorn answered with every thread stalled"
        close_all(stalled)
        stalled = []
        wait_for(lambda: answers(web_url), 30, "gunicorn to answer once they are gone", [web])
    finally:
        close_all(stalled)
        web.stop()
