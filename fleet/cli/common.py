"""What the command groups share: settings, running a child process, printing tables (or
JSON with --json), and reaching the API with errors as one line."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from core.config.settings import Settings, SettingsError, get_settings

log = logging.getLogger("laneway")
# The level `--log-level` gave, for the processes `laneway up`, `worker`, `web` and `beat`
# start (fleet/processes.py reads it); unset, they log at INFO.
LOG_LEVEL_ENV = "LANEWAY_LOG_LEVEL"


def unreachable_service(exc: BaseException | None) -> str | None:
    """One line for a database, Redis or the broker a command could not reach (down,
    refusing, a database that does not exist), or None for any other error. Read by the
    exception's class, so that a command that never touched SQLAlchemy or redis-py imports
    neither; and down the chain of causes, since Celery and kombu raise their own errors
    from redis-py's (Celery's result backend: a RuntimeError, "Retry limit exceeded")."""

    def line(error: object) -> str:
        return " ".join(str(error).split())

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        kinds = {(k.__module__.split(".")[0], k.__name__) for k in type(exc).__mro__}
        if ("sqlalchemy", "OperationalError") in kinds:
            reason = getattr(exc, "orig", None) or exc
            return f"the database is unreachable: {line(reason)}"
        if kinds & {("redis", "ConnectionError"), ("redis", "TimeoutError")}:
            return f"Redis is unreachable: {line(exc)}"
        if ("kombu", "OperationalError") in kinds:
            return f"the broker is unreachable: {line(exc)}"
        exc = exc.__cause__ or exc.__context__
    return None


def cli_settings() -> Settings:
    try:
        return get_settings()
    except SettingsError as exc:
        raise click.ClickException(f"invalid setting: {exc}") from None


def process_settings() -> Settings:
    """The settings of a command that starts Laneway's processes, with the OTEL_*
    variables checked first: a tracing setting Laneway cannot honour stops the command at
    once, naming it, rather than each process it starts after their imports (each process
    checks again at its own start, for those started without `laneway`)."""
    from core.obs.tracing import TracingError, check

    settings = cli_settings()
    try:
        check()
    except TracingError as exc:
        raise click.ClickException(str(exc)) from None
    return settings


# Signals `laneway` passes on to its child, which runs in a session of its own so that each
# reaches it exactly once. A container's runtime (docker stop, a pod's termination) sends
# SIGTERM to PID 1 alone: without the forward, laneway would die and the celery or gunicorn
# child would be killed without its warm shutdown. A signal to laneway's whole process group
# (a terminal's Ctrl-C, `kill -- -PGID`, a supervisor stopping a group) would otherwise reach
# the child twice, itself and forwarded: a second SIGINT makes a celery worker's shutdown
# cold, and a second SIGTERM that lands while the child's Python is finalizing (its handlers
# back at the default) kills it with status 143 instead of its clean 0.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


def run_child(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run one process in the foreground, keeping the embedded Redis alive around it;
    FORWARDED_SIGNALS are passed on to it, and its exit status is returned (128 + N if
    signal N ended it, as a shell reports)."""
    from core.store.redis_conn import embedded_redis
    from fleet.lifeline import die_with_parent

    child: list[subprocess.Popen] = []
    pending: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        if child:
            child[0].send_signal(signum)
        else:
            pending.append(signum)  # arrived before the child existed: sent once it does

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        with embedded_redis(cli_settings()):
            # The child dies with laneway, should laneway be killed (fleet/lifeline.py).
            full_env = {**os.environ, **(env or {})}
            child.append(
                subprocess.Popen(
                    argv, env=full_env, preexec_fn=die_with_parent(), start_new_session=True
                )
            )
            for signum in pending:
                child[0].send_signal(signum)
            code = child[0].wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code if code >= 0 else 128 - code


# --- output ------------------------------------------------------------------------------

json_option = click.option(
    "--json", "as_json", is_flag=True, help="one JSON object per line instead of a table"
)


def table(
    rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, int]], as_json: bool
) -> None:
    """Rows as aligned columns (name, width; the last column unpadded), or as JSON lines."""
    if as_json:
        for row in rows:
            click.echo(json.dumps(row, default=str))
        return
    click.echo("  ".join(f"{name:{width}}" for name, width in columns).rstrip())
    for row in rows:
        cells = ["" if row.get(name) is None else str(row[name]) for name, _ in columns]
        click.echo("  ".join(f"{c:{w}}" for c, (_, w) in zip(cells, columns, strict=True)).rstrip())


# --- the API -----------------------------------------------------------------------------


def api_options(command: Callable) -> Callable:
    """--url and --api-key (or LANEWAY_URL, LANEWAY_API_KEY) on a command that calls the API."""
    command = click.option(
        "--api-key",
        envvar="LANEWAY_API_KEY",
        show_envvar=True,
        default=None,
        help="an API key (lw_...)",
    )(command)
    return click.option(
        "--url",
        envvar="LANEWAY_URL",
        show_envvar=True,
        default=None,
        help="the web app (default http://LANEWAY_WEB_HOST:LANEWAY_WEB_PORT)",
    )(command)


@contextmanager
def api(url: str | None, api_key: str | None) -> Iterator[Any]:
    """A client of the API; any failure (a refused connection, a bad key, a missing job)
    ends the command with one line naming it and exit status 1."""
    from laneway import Client, LanewayError, Retry

    if not api_key:
        raise click.ClickException("no API key: pass --api-key or set LANEWAY_API_KEY")
    if url is None:
        s = cli_settings()
        url = f"http://{s.web_host}:{s.web_port}"
    try:
        # A command's caller is waiting at a terminal: a few retries, not minutes of them.
        with Client(url, api_key, retry=Retry(retries=3, total=15.0)) as client:
            yield client
    except LanewayError as exc:
        raise click.ClickException(_one_line(exc)) from None
    except TimeoutError as exc:
        raise click.ClickException(str(exc)) from None


def _one_line(exc: Exception) -> str:
    from laneway import LanewayError

    if isinstance(exc, LanewayError) and exc.status == 401:
        return f"the API key was refused: {exc}"
    return str(exc).replace("\n", " ")
