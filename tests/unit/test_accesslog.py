"""gunicorn's access lines written off the request's thread (webapp/accesslog.py): the same
lines gunicorn writes, each once, redacted, and written without being asked."""

from __future__ import annotations

import datetime
import re
import threading
import time

import pytest
from gunicorn.config import Config
from gunicorn.glogging import Logger

from fleet.processes import ACCESS_LOG_FORMAT
from webapp.accesslog import AccessLogger

STAMP = re.compile(r"\[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\]")


class Response:
    def __init__(self, status="200 OK", sent=120):
        self.status, self.sent = status, sent
        self.headers = [("Content-Type", "application/json")]


class Request:
    headers = [("HOST", "x"), ("USER-AGENT", "bench")]


def environ(path="/v1/embed", agent='curl/8 "quoted"', **more):
    return {
        "REMOTE_ADDR": "127.0.0.1", "REQUEST_METHOD": "POST", "RAW_URI": path,
        "SERVER_PROTOCOL": "HTTP/1.1", "PATH_INFO": path.split("?")[0], "QUERY_STRING": "",
        "HTTP_USER_AGENT": agent, "wsgi.input": object(), **more,
    }  # fmt: skip


def logger(kind, path, form=ACCESS_LOG_FORMAT):
    cfg = Config()
    cfg.set("accesslog", str(path))
    cfg.set("access_log_format", form)
    return kind(cfg)


def lines(path):
    return [STAMP.sub("[T]", line) for line in path.read_text().splitlines()]


def written(kind, path, form, cases) -> list[str]:
    """The lines a logger of `kind` writes for `cases`. One at a time: gunicorn's loggers
    share the `gunicorn.access` logger, whose handlers the latest one sets."""
    log = logger(kind, path, form)
    for resp, env, took in cases:
        log.access(resp, Request(), env, took)
    if isinstance(log, AccessLogger):
        log.drain()
    return lines(path)


# Every atom gunicorn makes without a header or environ name, twice over for one, and one
# it does not know ('-').
FULL = (
    '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s %(B)s %(D)s %(L)s %(p)s %(T)s %(m)s %(q)s '
    '%(U)s %(H)s "%(f)s" "%(a)s" %(M)s %(x)s %(s)s'
)


@pytest.mark.parametrize("form", [ACCESS_LOG_FORMAT, FULL])
def test_its_lines_are_gunicorns(tmp_path, form):
    took = datetime.timedelta(seconds=1, microseconds=2500)
    cases = [
        (Response(), environ(), took),
        (Response("404 NOT FOUND", None), environ("/v1/jobs/x?page=2", agent="-"), took),
        (Response("200 OK", 0), environ(HTTP_AUTHORIZATION="Basic YWxpY2U6c2VjcmV0"), took),
        (Response(201, 5), environ(HTTP_REFERER='http://x/"a"', QUERY_STRING="q=1"), took),
    ]
    ours = written(AccessLogger, tmp_path / "ours", form, cases)
    assert ours == written(Logger, tmp_path / "g", form, cases) and len(ours) == 4


def test_a_format_with_header_atoms_is_written_as_gunicorn_writes_it(tmp_path):
    form = '%(h)s "%({user-agent}i)s" %({content-type}o)s'
    cases = [(Response(), environ(), datetime.timedelta(microseconds=900))]
    log = logger(AccessLogger, tmp_path / "o", form)
    log.access(Response(), Request(), environ(), cases[0][2])
    assert lines(tmp_path / "o") == ['127.0.0.1 "bench" application/json']  # at once
    assert lines(tmp_path / "o") == written(Logger, tmp_path / "g", form, cases)


def test_every_request_of_many_threads_is_written_once_in_each_threads_order(tmp_path):
    ours = logger(AccessLogger, tmp_path / "ours")
    took = datetime.timedelta(microseconds=1)

    def serve(thread):
        for n in range(200):
            ours.access(Response(), Request(), environ(f"/t{thread}/{n}"), took)

    threads = [threading.Thread(target=serve, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ours.drain()
    paths = [line.split('"')[1].split()[1] for line in lines(tmp_path / "ours")]
    assert sorted(paths) == sorted(f"/t{t}/{n}" for t in range(8) for n in range(200))
    for t in range(8):
        mine = [p for p in paths if p.startswith(f"/t{t}/")]
        assert mine == [f"/t{t}/{n}" for n in range(200)]


def test_lines_are_written_without_a_drain_and_redacted(tmp_path):
    from core.obs.logsafe import install_redaction

    install_redaction()
    ours = logger(AccessLogger, tmp_path / "ours")
    key = "lw_0123456789ab_" + "s" * 30
    ours.access(Response(), Request(), environ(f"/v1/jobs?key={key}"), datetime.timedelta(0))
    deadline = time.monotonic() + 10
    while not (tmp_path / "ours").read_text():
        assert time.monotonic() < deadline, "the writer thread wrote nothing"
        time.sleep(0.01)
    (line,) = lines(tmp_path / "ours")
    assert "lw_0123456789ab_***" in line and "s" * 30 not in line
