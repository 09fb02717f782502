"""The `laneway` command: run each process, manage the database and accounts, submit jobs."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from core.config.settings import Settings, SettingsError, get_settings
from core.store.fleet_metrics import BEAT_MAX_AGE
from core.vocab import ACCOUNT_TYPES, LANES

log = logging.getLogger("laneway")


def _settings() -> Settings:
    try:
        return get_settings()
    except SettingsError as exc:
        raise click.ClickException(f"invalid setting: {exc}") from None


# Signals `laneway` passes on to its child. A container's runtime (docker stop, a pod's
# termination) sends SIGTERM to PID 1 alone: without this, laneway would die and the
# celery or gunicorn child would be killed later without its warm shutdown. A terminal's
# Ctrl-C already reaches the whole process group, so SIGINT is not passed on (a second
# SIGINT makes a celery worker's shutdown cold); a second SIGTERM changes nothing.
FORWARDED_SIGNALS = (signal.SIGTERM,)


def _run_child(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run one process in the foreground, keeping the embedded Redis alive around it;
    SIGTERM is passed on to it, and its exit status is returned (128 + N if signal N
    ended it, as a shell reports)."""
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
        with embedded_redis(_settings()):
            # The child dies with laneway, should laneway be killed (fleet/lifeline.py).
            full_env = {**os.environ, **(env or {})}
            child.append(subprocess.Popen(argv, env=full_env, preexec_fn=die_with_parent()))
            for signum in pending:
                child[0].send_signal(signum)
            while True:
                try:
                    code = child[0].wait()
                    break
                except KeyboardInterrupt:
                    continue  # the child got the same SIGINT: wait for its own shutdown
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code if code >= 0 else 128 - code


@click.group()
@click.option("--log-level", default="INFO", show_default=True)
def cli(log_level: str) -> None:
    """Laneway: a Celery worker fleet for NLP inference."""
    from core.obs.logsafe import install_redaction

    install_redaction()
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


def _webhook_url(_ctx: Any, _param: Any, value: str | None) -> str | None:
    """An http(s) URL with a host. Echoed nowhere: it may carry a secret token."""
    if value is None:
        return None
    import httpx

    try:
        url = httpx.URL(value)
    except httpx.InvalidURL:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host or len(value) > 2000:
        raise click.BadParameter(
            "must be an http:// or https:// URL with a host (2000 chars at most)"
        )
    return value


@accounts.command("create")
@click.argument("name")
@click.option("--type", "type_", type=click.Choice(ACCOUNT_TYPES), default="standard")
@click.option("--admin", is_flag=True, help="may manage every account and key (/v1/admin)")
@click.option("--key-name", default=None, help="a name for its first API key")
@click.option("--webhook", default=None, callback=_webhook_url, help="told when inbox jobs end")
def accounts_create(
    name: str, type_: str, admin: bool, key_name: str | None, webhook: str | None
) -> None:
    """Create an account; prints its API key once, on its own line."""
    from sqlalchemy.exc import IntegrityError

    from db.queries import create_account
    from db.session import session_scope

    try:
        with session_scope(_settings()) as session:
            account, key = create_account(session, name, type_, is_admin=admin, key_name=key_name)
            account.webhook_url = webhook
    except IntegrityError:
        raise click.ClickException(f"an account named {name!r} already exists") from None
    role = " admin" if admin else ""
    click.echo(f"created {type_}{role} account {name!r}; its API key (shown once):", err=True)
    click.echo(key)


@accounts.command("list")
def accounts_list() -> None:
    """List accounts: id, name, type, admin, live keys."""
    from db.queries import is_live, list_accounts, list_keys
    from db.session import session_scope

    with session_scope(_settings()) as session:
        click.echo(f"{'id':>6}  {'name':30}  {'type':10}  {'admin':5}  live keys")
        for account in list_accounts(session):
            live = sum(is_live(k) for k in list_keys(session, account.id))
            admin = "yes" if account.is_admin else ""
            click.echo(f"{account.id:>6}  {account.name:30}  {account.type:10}  {admin:5}  {live}")


@accounts.group("keys")
def keys() -> None:
    """An account's API keys: create, list, rotate, revoke (keys are named by prefix)."""


def _find_account(session: Any, ref: str) -> Any:
    from db.queries import find_account

    account = find_account(session, ref)
    if account is None:
        raise click.ClickException(f"no account {ref!r} (give its name or id)")
    return account


def _find_key(session: Any, prefix: str) -> Any:
    from db.queries import find_key

    row = find_key(session, prefix)
    if row is None:
        raise click.ClickException(f"no API key with prefix {prefix!r} (e.g. lw_0123456789ab)")
    return row


def _print_key(key: str) -> None:
    click.echo("the new API key (shown once):", err=True)
    click.echo(key)


@keys.command("create")
@click.argument("account")
@click.option("--name", default=None, help="what the key is for, e.g. nightly-upload")
def keys_create(account: str, name: str | None) -> None:
    """Add an API key to ACCOUNT (name or id); prints it once."""
    from db.queries import add_api_key
    from db.session import session_scope

    with session_scope(_settings()) as session:
        _, key = add_api_key(session, _find_account(session, account), name)
    _print_key(key)


@keys.command("list")
@click.argument("account")
def keys_list(account: str) -> None:
    """List ACCOUNT's keys by prefix (the keys themselves are never stored)."""
    from db.queries import aware, is_live, list_keys
    from db.session import session_scope

    with session_scope(_settings()) as session:
        click.echo(f"{'prefix':16}  {'name':24}  {'created':25}  state")
        for row in list_keys(session, _find_account(session, account).id):
            if row.revoked_at is None:
                state = "live"
            else:
                when = aware(row.revoked_at).isoformat(timespec="seconds")
                state = f"live until {when}" if is_live(row) else f"revoked {when}"
            created = aware(row.created_at).isoformat(timespec="seconds")
            click.echo(f"{row.prefix:16}  {row.name or '':24}  {created:25}  {state}")


@keys.command("rotate")
@click.argument("prefix")
@click.option(
    "--grace", default=0, show_default=True, type=click.IntRange(0, 30 * 24 * 3600),
    help="seconds the old key keeps working",
)  # fmt: skip
def keys_rotate(prefix: str, grace: int) -> None:
    """Replace the key PREFIX with a new one; the old one stops after --grace seconds."""
    from db.queries import is_live, rotate_key
    from db.session import session_scope

    with session_scope(_settings()) as session:
        row = _find_key(session, prefix)
        if not is_live(row):
            raise click.ClickException(f"the key {prefix} is already revoked")
        _, key = rotate_key(session, row, grace)
    _print_key(key)


@keys.command("revoke")
@click.argument("prefix")
def keys_revoke(prefix: str) -> None:
    """Revoke the key PREFIX now."""
    from db.queries import revoke_key
    from db.session import session_scope

    with session_scope(_settings()) as session:
        revoke_key(session, _find_key(session, prefix))
    click.echo(f"revoked {prefix}")


@accounts.command("webhook")
@click.argument("name")
@click.argument("url", required=False, callback=_webhook_url)
@click.option("--clear", is_flag=True, help="remove the account's webhook")
def accounts_webhook(name: str, url: str | None, clear: bool) -> None:
    """Set (or --clear) the URL told when the account's inbox jobs reach the outbox."""
    from sqlalchemy import select

    from db.models import Account
    from db.session import session_scope

    if (url is None) != clear:
        raise click.UsageError("give a URL, or --clear")
    with session_scope(_settings()) as session:
        account = session.scalar(select(Account).where(Account.name == name))
        if account is None:
            raise click.ClickException(f"no account named {name!r}")
        account.webhook_url = url
    click.echo(f"webhook {'cleared' if clear else 'set'} for account {name!r}")


# --- the nightly inbox --------------------------------------------------------------------


@cli.group()
def inbox() -> None:
    """The nightly inbox (LANEWAY_INBOX_DIR/<account>/)."""


@inbox.command("scan")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per file")
def inbox_scan(as_json: bool) -> None:
    """Take the inbox's complete files now, as beat does on LANEWAY_INBOX_SCHEDULE."""
    import json

    from core.obs.logsafe import printable
    from core.store.redis_conn import embedded_redis
    from jobs.inbox import scan_inbox

    settings = _settings()
    with embedded_redis(settings):
        outcomes = scan_inbox(settings, progress=lambda message: click.echo(message, err=True))
    for outcome in outcomes:
        if as_json:
            click.echo(json.dumps(outcome.as_dict()))
            continue
        shown = outcome.as_dict()  # names escaped: a newline in one never forges a line
        where = f"{shown['account']}/{shown['name']}" if outcome.account else shown["name"]
        job = f" job {outcome.job_id}" if outcome.job_id else ""
        click.echo(f"{outcome.status:9s} {where}{job}: {printable(outcome.detail)}")
    if not outcomes:
        click.echo(f"nothing in {settings.inbox_dir}", err=True)


# --- processes ---------------------------------------------------------------------------


@cli.command()
@click.argument("lane", type=click.Choice((*LANES, "maintenance", "interactive")))
@click.option(
    "--concurrency", "-c", type=int, default=None, help="processes (cpu), threads (interactive)"
)
@click.option("--name", default=None, help="node name before @host (default: the lane)")
@click.option("--device", default=None, help="gpu: run only the worker for this device")
@click.option(
    "--lane",
    "interactive_lane",
    type=click.Choice(LANES),
    default="cpu",
    show_default=True,
    help="interactive: the lane whose interactive queue to serve",
)
def worker(
    lane: str, concurrency: int | None, name: str | None, device: str | None, interactive_lane: str
) -> None:
    """Run Celery workers for one queue: cpu (with maintenance), maintenance alone, gpu:
    one process per device in LANEWAY_GPU_DEVICES (default: every CUDA device), each
    pinned to its device (CUDA_VISIBLE_DEVICES) and named gpu<N>@host, or interactive:
    the dynamic batcher on interactive.cpu, or with --lane gpu on interactive.gpu, pinned
    to --device (default the first gpu device)."""
    from fleet.processes import interactive_worker, worker_argv, worker_env
    from workers.devices import LaneError

    settings = _settings()
    try:
        if lane == "interactive":
            _, argv, env = interactive_worker(settings, interactive_lane, device, name, concurrency)
            sys.exit(_run_child(argv, env))
        env = worker_env(lane, settings)
    except LaneError as exc:
        raise click.ClickException(str(exc)) from None
    if lane != "gpu":
        sys.exit(_run_child(worker_argv(lane, settings, concurrency, name), env))
    sys.exit(_run_gpu_workers(settings, device))


def _run_gpu_workers(settings: Settings, device: str | None) -> int:
    from core.store.redis_conn import embedded_redis
    from fleet.processes import add_gpu_workers, gpu_devices
    from fleet.supervisor import UNTIL_STOPPED, Fleet

    devices = (device,) if device is not None else gpu_devices(settings)
    if not devices or not all(d.isdigit() for d in devices):
        raise click.ClickException(f"no gpu device to run a worker on: {devices!r}")
    with embedded_redis(settings):
        fleet = Fleet()
        # A worker stopped warm (beat's scale-down) stays stopped; a crashed one restarts.
        add_gpu_workers(fleet, settings, devices, UNTIL_STOPPED)
        fleet.start_always()
        return fleet.run_until_signal()


@cli.command()
@click.option("--host", default=None, help="default LANEWAY_WEB_HOST")
@click.option("--port", type=int, default=None, help="default LANEWAY_WEB_PORT")
def web(host: str | None, port: int | None) -> None:
    """Run the web app (gunicorn)."""
    from fleet.processes import web_argv

    settings = _settings()
    sys.exit(_run_child(web_argv(settings, host or settings.web_host, port or settings.web_port)))


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", type=int, default=None, help="default LANEWAY_FLOWER_PORT (5555)")
@click.option(
    "--max-tasks",
    type=click.IntRange(1),
    default=None,
    help="tasks Flower keeps in memory (default LANEWAY_FLOWER_MAX_TASKS, 10000)",
)
def flower(host: str, port: int | None, max_tasks: int | None) -> None:
    """Run Flower on the broker: workers, tasks and its own Prometheus metrics (in memory,
    bounded by --max-tasks). Set FLOWER_BASIC_AUTH=user:password to ask for a password."""
    from fleet.processes import flower_argv

    settings = _settings()
    argv = flower_argv(
        settings, host, port or settings.flower_port, max_tasks or settings.flower_max_tasks
    )
    sys.exit(_run_child(argv))


@cli.command()
def beat() -> None:
    """Run celery beat (the reconciler, scale-down of idle gpu workers, lane statistics)."""
    from fleet.processes import beat_argv

    sys.exit(_run_child(beat_argv(_settings())))


@cli.command()
def fleet() -> None:
    """This machine's workers: cpu workers kept up, a gpu worker per device started when
    gpu work waits (beat stops idle ones); Ctrl-C stops them all."""
    from core.store.redis_conn import embedded_redis
    from fleet.processes import worker_fleet

    settings = _settings()
    with embedded_redis(settings):
        supervisor = worker_fleet(settings)
        supervisor.start_always()
        code = supervisor.run_until_signal()
    sys.exit(code)


@cli.command()
@click.option("--host", default=None)
@click.option("--port", type=int, default=None)
def up(host: str | None, port: int | None) -> None:
    """Run web, beat and the fleet (cpu workers, gpu workers on demand) on this machine;
    Ctrl-C stops them all."""
    from core.store.redis_conn import embedded_redis
    from fleet.processes import full_fleet

    settings = _settings()
    with embedded_redis(settings):
        supervisor = full_fleet(settings, host or settings.web_host, port or settings.web_port)
        click.echo(f"laneway is up: http://{host or settings.web_host}:{port or settings.web_port}")
        code = supervisor.run_until_signal()
    sys.exit(code)


@cli.command()
@click.argument("node")
@click.option("--timeout", default=30.0, show_default=True)
def health(node: str, timeout: float) -> None:
    """Run the device health check (a small tensor operation) on one worker, e.g. gpu0@host."""
    import json

    from celery.utils.nodenames import worker_direct

    from core.queueing.celery_app import make_celery

    celery = make_celery(get_settings())
    result = celery.send_task("laneway.device_health", queue=worker_direct(node))
    try:
        report = result.get(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - a timeout or the check's own failure
        raise click.ClickException(f"{node}: no health report ({type(exc).__name__})") from None
    click.echo(json.dumps(report))
    if not report.get("ok"):
        sys.exit(1)


# --- liveness probes (compose health checks, Kubernetes probes) ---------------------------


@cli.group()
def probe() -> None:
    """Liveness checks: exit 0 when alive, 1 saying why not. They load no model."""


def _probe_exit(result: tuple[bool, str]) -> None:
    alive, why = result
    click.echo(why, err=not alive)
    sys.exit(0 if alive else 1)


@probe.command("beat")
@click.option("--max-age", type=float, default=BEAT_MAX_AGE, show_default=True, help="seconds")
def probe_beat(max_age: float) -> None:
    """Beat has ticked lately (its heartbeat file under LANEWAY_HOME)."""
    from fleet.probes import beat_alive

    _probe_exit(beat_alive(_settings(), max_age))


@probe.command("worker")
@click.argument("name")
@click.option("--timeout", default=10.0, show_default=True)
def probe_worker(name: str, timeout: float) -> None:
    """Worker NAME answers a ping through the broker (`cpu` means cpu@this host)."""
    from fleet.probes import node_name, worker_alive

    _probe_exit(worker_alive(_settings(), node_name(name), timeout))


@probe.command("http")
@click.argument("url")
@click.option("--timeout", default=5.0, show_default=True)
def probe_http(url: str, timeout: float) -> None:
    """URL answers 200 (e.g. the web app's /healthz, Flower's /healthcheck)."""
    from fleet.probes import http_alive

    _probe_exit(http_alive(url, timeout))


# --- dead letters ------------------------------------------------------------------------


@cli.group()
def dlq() -> None:
    """Dead letters: items and chunks that failed for good."""


@dlq.command("list")
@click.option("--job", "job_id", default=None, help="only this job's letters")
@click.option("--all", "show_all", is_flag=True, help="include letters already sent back")
def dlq_list(job_id: str | None, show_all: bool) -> None:
    """List dead letters (open ones unless --all)."""
    from sqlalchemy import select

    from db.models import DeadLetter
    from db.session import session_scope

    query = select(DeadLetter).order_by(DeadLetter.id)
    if job_id:
        query = query.where(DeadLetter.job_id == _job_uuid(job_id))
    if not show_all:
        query = query.where(DeadLetter.retried_at.is_(None))
    with session_scope(_settings()) as session:
        letters = session.scalars(query).all()
        for x in letters:
            state = "sent back" if x.retried_at else "open"
            items = ",".join(x.item_ids[:5]) + (" ..." if len(x.item_ids) > 5 else "")
            click.echo(
                f"{x.id}\t{x.job_id}\t{x.kind}\t{state}\tattempts={x.attempts}\t"
                f"items={items}\t{x.error}"
            )
    click.echo(f"{len(letters)} dead letter(s)", err=True)


def _job_uuid(job_id: str):  # noqa: ANN202
    import uuid

    try:
        return uuid.UUID(job_id)
    except ValueError:
        raise click.BadParameter(f"not a job id: {job_id!r}") from None


@dlq.command("retry")
@click.option("--job", "job_id", default=None, help="send back this job's open letters")
@click.option("--id", "letter_ids", type=int, multiple=True, help="a letter id (repeatable)")
@click.option("--all", "every", is_flag=True, help="send back every open letter")
def dlq_retry(job_id: str | None, letter_ids: tuple[int, ...], every: bool) -> None:
    """Send dead letters back: their items run again and their jobs are finalized anew."""
    from jobs.lifecycle import retry_dead_letters

    if not (job_id or letter_ids or every):
        raise click.UsageError("name --job JOB, --id N or --all")
    retried = retry_dead_letters(
        job_id=_job_uuid(job_id) if job_id else None,
        letter_ids=list(letter_ids) or None,
        settings=_settings(),
    )
    for job, items in retried.jobs.items():
        click.echo(f"job {job}: {items} item(s) sent back")
    for job, why in retried.skipped.items():
        click.echo(f"job {job}: not sent back ({why})", err=True)
    click.echo(f"{retried.letters} dead letter(s) sent back", err=True)


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
    """Submit a CSV (id,text) or JSONL file, optionally gzipped (.csv.gz, .jsonl.gz), as a
    job; the upload shows a progress bar, and --wait one for the job."""
    from laneway.client import Client, LanewayError

    settings = _settings()
    client = Client(url or f"http://{settings.web_host}:{settings.web_port}", api_key)
    try:
        job = _upload(client, file, tasks=tasks, labels=labels)
        click.echo(f"job {job['id']} queued on the {job['lane']} lane")
        if wait:
            final = _wait_with_bar(client, job["id"])
            print_summary(final)
            if final["status"] not in ("succeeded", "partial"):
                sys.exit(1)
    except LanewayError as exc:
        raise click.ClickException(str(exc)) from None


def _upload(client: Any, file: Path, **kwargs: Any) -> dict[str, Any]:
    """Client.submit_file with a progress bar on stderr following the upload."""
    stderr = click.get_text_stream("stderr")
    size = file.stat().st_size
    with click.progressbar(length=size, label=f"uploading {file.name}", file=stderr) as bar:
        return client.submit_file(
            file, progress=lambda sent, _: bar.update(sent - bar.pos), **kwargs
        )


def _wait_with_bar(client: Any, job_id: str, check: Any = None) -> dict[str, Any]:
    """Client.wait with a progress bar of the job's items on stderr."""
    total = client.job(job_id)["progress"]["total"]
    stderr = click.get_text_stream("stderr")
    label = f"job {job_id[:8]}"
    with click.progressbar(
        length=total, label=label, show_eta=True, show_pos=True, file=stderr
    ) as bar:
        return client.wait(
            job_id, progress=lambda job: bar.update(job["progress"]["done"] - bar.pos), check=check
        )


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
    runtimes = job.get("runtimes") or []
    if runtimes:
        ran = "; ".join(f"{r['runtime']} ({r['chunks']} chunks)" for r in runtimes)
        click.echo(f"ran with {ran}")
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
    from core.store.redis_conn import embedded_redis

    settings = _settings()
    port = _free_port()
    with embedded_redis(settings):
        final = _run_demo(settings, file, port, show)
    if final["status"] != "succeeded":
        sys.exit(1)


def _run_demo(settings: Settings, file: Path, port: int, show: int) -> dict[str, Any]:
    import itertools

    from laneway.client import Client, LanewayError

    from db.queries import create_account
    from db.session import session_scope
    from fleet.processes import full_fleet

    log_dir = settings.home / "logs"
    fleet = full_fleet(settings, "127.0.0.1", port, log_dir=log_dir)
    fleet.supervise_in_background()
    click.echo(f"fleet started (web on port {port}); process logs in {log_dir}")
    try:
        with session_scope(settings) as session:
            _, key = create_account(session, f"demo-{int(time.time() * 1000)}", "standard")
        client = Client(f"http://127.0.0.1:{port}", key)

        def check() -> None:
            if fleet.dead():
                raise LanewayError(0, "fleet_died", f"fleet processes died: {fleet.dead()}")

        client.wait_healthy(timeout=60, check=check)
        job = client.submit_file(file)
        click.echo(f"submitted {file} as job {job['id']} ({job['lane']} lane)")
        final = _wait_with_bar(client, job["id"], check=check)
        print_summary(final)
        for record in itertools.islice(client.results(job["id"]), show):
            click.echo(f"  {record['id']}: {record.get('label')} ({record.get('score')})")
    finally:
        fleet.stop()
    return final


def main() -> None:
    cli(prog_name="laneway")


if __name__ == "__main__":
    main()
