"""The `laneway` command: run each process, manage the database and accounts, submit jobs."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from laneway.settings import ACCOUNT_TYPES, LANES, Settings, SettingsError, get_settings

log = logging.getLogger("laneway")


def _settings() -> Settings:
    try:
        return get_settings()
    except SettingsError as exc:
        raise click.ClickException(f"invalid setting: {exc}") from None


def _run_child(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run one process in the foreground, keeping the embedded Redis alive around it."""
    from laneway.redis_conn import embedded_redis

    with embedded_redis(_settings()):
        proc = subprocess.Popen(argv, env={**os.environ, **(env or {})})
        try:
            return proc.wait()
        except KeyboardInterrupt:
            return proc.wait()


@click.group()
@click.option("--log-level", default="INFO", show_default=True)
def cli(log_level: str) -> None:
    """Laneway: a Celery worker fleet for NLP inference."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


# --- database and accounts -------------------------------------------------------------


@cli.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Migrate the database to the newest schema."""
    from db.migrate import upgrade

    settings = _settings()
    upgrade(settings, revision=revision)
    click.echo(f"database at {revision}: {_safe_url(settings.database_url)}")


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@cli.group()
def accounts() -> None:
    """Accounts and their API keys."""


@accounts.command("create")
@click.argument("name")
@click.option("--type", "type_", type=click.Choice(ACCOUNT_TYPES), default="standard")
def accounts_create(name: str, type_: str) -> None:
    """Create an account; prints its API key once, on its own line."""
    from sqlalchemy.exc import IntegrityError

    from db.queries import create_account
    from db.session import session_scope

    try:
        with session_scope(_settings()) as session:
            _, key = create_account(session, name, type_)
    except IntegrityError:
        raise click.ClickException(f"an account named {name!r} already exists") from None
    click.echo(f"created {type_} account {name!r}; its API key (shown once):", err=True)
    click.echo(key)


# --- processes ---------------------------------------------------------------------------


def worker_argv(lane: str, settings: Settings, concurrency: int | None = None) -> list[str]:
    return [
        sys.executable, "-m", "celery", "-A", "tasks", "worker",
        "-Q", lane,
        "-n", f"{lane}@%h",
        "-c", str(concurrency or settings.worker_concurrency),
        "--loglevel", "INFO",
        "-E",
    ]  # fmt: skip


def worker_env(lane: str, settings: Settings) -> dict[str, str]:
    """The environment a lane's worker runs with; raises LaneError when it cannot run."""
    from workers.devices import check_lane

    return {
        "LANEWAY_DEVICE": check_lane(lane, settings),
        "LANEWAY_GPU_FALLBACK": settings.gpu_fallback,
    }


@cli.command()
@click.argument("lane", type=click.Choice(LANES))
@click.option("--concurrency", "-c", type=int, default=None, help="child processes")
def worker(lane: str, concurrency: int | None) -> None:
    """Run a Celery worker for one queue (cpu or gpu)."""
    from workers.devices import LaneError

    settings = _settings()
    try:
        env = worker_env(lane, settings)
    except LaneError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(_run_child(worker_argv(lane, settings, concurrency), env))


def web_argv(settings: Settings, host: str, port: int) -> list[str]:
    return [
        sys.executable, "-m", "gunicorn",
        "--bind", f"{host}:{port}",
        "--workers", str(settings.web_workers),
        "--threads", "4",
        "--access-logfile", "-",
        "webapp:create_app()",
    ]  # fmt: skip


@cli.command()
@click.option("--host", default=None, help="default LANEWAY_WEB_HOST")
@click.option("--port", type=int, default=None, help="default LANEWAY_WEB_PORT")
def web(host: str | None, port: int | None) -> None:
    """Run the web app (gunicorn)."""
    settings = _settings()
    sys.exit(_run_child(web_argv(settings, host or settings.web_host, port or settings.web_port)))


def beat_argv(settings: Settings) -> list[str]:
    settings.home.mkdir(parents=True, exist_ok=True)
    return [
        sys.executable, "-m", "celery", "-A", "tasks", "beat",
        "--schedule", str(settings.home / "celerybeat-schedule"),
        "--loglevel", "INFO",
    ]  # fmt: skip


@cli.command()
def beat() -> None:
    """Run celery beat (periodic maintenance)."""
    sys.exit(_run_child(beat_argv(_settings())))


def start_fleet(settings: Settings, host: str, port: int, log_dir: Path | None = None):  # noqa: ANN201
    """Migrate, then start web, a worker per queue and beat; returns the Fleet."""
    from db.migrate import upgrade
    from laneway.fleet import Fleet
    from workers.devices import LaneError, check_lane

    upgrade(settings)
    env: dict[str, str] = {}
    try:
        check_lane("gpu", settings)
    except LaneError:
        # One machine without CUDA: the gpu queue still needs a consumer, so run it on CPU.
        log.warning("no CUDA device found: the gpu worker runs on CPU (LANEWAY_GPU_FALLBACK=cpu)")
        env["LANEWAY_GPU_FALLBACK"] = "cpu"
        settings = Settings.from_env({**os.environ, **env})
    fleet = Fleet(log_dir=log_dir)
    fleet.start("web", web_argv(settings, host, port), env)
    for lane in LANES:
        fleet.start(
            f"worker-{lane}", worker_argv(lane, settings), {**env, **worker_env(lane, settings)}
        )
    fleet.start("beat", beat_argv(settings), env)
    return fleet


@cli.command()
@click.option("--host", default=None)
@click.option("--port", type=int, default=None)
def up(host: str | None, port: int | None) -> None:
    """Run web, a worker per queue and beat on this machine; Ctrl-C stops them all."""
    from laneway.redis_conn import embedded_redis

    settings = _settings()
    with embedded_redis(settings):
        fleet = start_fleet(settings, host or settings.web_host, port or settings.web_port)
        click.echo(f"laneway is up: http://{host or settings.web_host}:{port or settings.web_port}")
        code = fleet.run_until_signal()
    sys.exit(code)


# --- client ----------------------------------------------------------------------------


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--labels", default=None, help="comma-separated labels (default: settings)")
@click.option("--tasks", default="classify", show_default=True, help="comma-separated tasks")
@click.option("--wait/--no-wait", default=False, help="show progress until the job ends")
@click.option("--url", envvar="LANEWAY_URL", default=None, help="default http://WEB_HOST:WEB_PORT")
@click.option("--api-key", envvar="LANEWAY_API_KEY", required=True, help="or LANEWAY_API_KEY")
def submit(
    file: Path, labels: str | None, tasks: str, wait: bool, url: str | None, api_key: str
) -> None:
    """Submit a CSV (id,text) or JSONL file as a job; --wait shows a progress bar."""
    from laneway.client import Client, ClientError

    settings = _settings()
    client = Client(url or f"http://{settings.web_host}:{settings.web_port}", api_key)
    try:
        job = client.submit_file(file, tasks=tasks, labels=labels)
        click.echo(f"job {job['id']} queued on the {job['lane']} lane")
        if wait:
            final = client.wait(job["id"], progress=True)
            print_summary(final)
            if final["status"] not in ("succeeded", "partial"):
                sys.exit(1)
    except ClientError as exc:
        raise click.ClickException(str(exc)) from None


def print_summary(job: dict[str, Any]) -> None:
    t = job["timings"]
    counts = job["counts"] or {}
    click.echo(
        f"job {job['id']}: {job['status']} on the {job['lane']} lane; "
        f"{counts.get('succeeded', 0)} succeeded, {counts.get('failed', 0)} failed"
    )
    if t.get("run_seconds"):
        rate = job["progress"]["total"] / t["run_seconds"] if t["run_seconds"] else 0
        stages = job.get("stage_seconds") or {}
        click.echo(
            f"ran {t['run_seconds']:.1f} s after {t['queued_seconds']:.1f} s queued "
            f"({rate:.0f} items/s; stages: pre {stages.get('pre', 0):.2f} s, "
            f"model {stages.get('model', 0):.1f} s, post {stages.get('post', 0):.2f} s)"
        )
    cost = job.get("cost")
    if cost:
        click.echo(f"cost ${cost['total']:.6f} (${cost['per_item']:.8f} per item)")
    for label, n in (job.get("label_counts") or {}).items():
        click.echo(f"  {n:6d}  {label}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--show", default=5, show_default=True, help="example results to print")
def demo(file: Path, show: int) -> None:
    """Start the fleet, submit FILE, show progress and a summary, stop everything."""
    from laneway.redis_conn import embedded_redis

    settings = _settings()
    port = _free_port()
    with embedded_redis(settings):
        final = _run_demo(settings, file, port, show)
    if final["status"] != "succeeded":
        sys.exit(1)


def _run_demo(settings: Settings, file: Path, port: int, show: int) -> dict[str, Any]:
    import json

    from db.queries import create_account
    from db.session import session_scope
    from laneway.client import Client

    log_dir = settings.home / "logs"
    fleet = start_fleet(settings, "127.0.0.1", port, log_dir=log_dir)
    click.echo(f"fleet started (web on port {port}); process logs in {log_dir}")
    try:
        with session_scope(settings) as session:
            _, key = create_account(session, f"demo-{int(time.time() * 1000)}", "standard")
        client = Client(f"http://127.0.0.1:{port}", key)
        client.wait_healthy(timeout=60, fleet=fleet)
        job = client.submit_file(file)
        click.echo(f"submitted {file} as job {job['id']} ({job['lane']} lane)")
        final = client.wait(job["id"], progress=True, fleet=fleet)
        print_summary(final)
        for line in client.results(job["id"])[:show]:
            record = json.loads(line)
            click.echo(f"  {record['id']}: {record.get('label')} ({record.get('score')})")
    finally:
        fleet.stop()
    return final


def main() -> None:
    cli(prog_name="laneway")


if __name__ == "__main__":
    main()
