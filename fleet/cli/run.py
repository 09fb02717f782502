"""The process commands: `laneway worker`, `web`, `flower`, `beat`, `fleet`, `up` and
`health`. Each runs in the foreground; `--log-level` reaches what they start."""

from __future__ import annotations

import sys

import click

from core.config.settings import Settings
from core.vocab import LANES
from fleet.cli.common import cli_settings, process_settings, run_child


@click.command()
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

    settings = process_settings()
    try:
        if lane == "interactive":
            _, argv, env = interactive_worker(settings, interactive_lane, device, name, concurrency)
            sys.exit(run_child(argv, env))
        env = worker_env(lane, settings)
    except LaneError as exc:
        raise click.ClickException(str(exc)) from None
    if lane != "gpu":
        sys.exit(run_child(worker_argv(lane, settings, concurrency, name), env))
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


@click.command()
@click.option("--host", default=None, help="default LANEWAY_WEB_HOST")
@click.option("--port", type=int, default=None, help="default LANEWAY_WEB_PORT")
def web(host: str | None, port: int | None) -> None:
    """Run the web app (gunicorn)."""
    from fleet.processes import web_argv

    settings = process_settings()
    sys.exit(run_child(web_argv(settings, host or settings.web_host, port or settings.web_port)))


@click.command()
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

    settings = process_settings()
    argv = flower_argv(
        settings, host, port or settings.flower_port, max_tasks or settings.flower_max_tasks
    )
    sys.exit(run_child(argv))


@click.command()
def beat() -> None:
    """Run celery beat (the reconciler, scale-down of idle gpu workers, lane statistics)."""
    from fleet.processes import beat_argv

    sys.exit(run_child(beat_argv(process_settings())))


@click.command()
def fleet() -> None:
    """This machine's workers: cpu workers kept up, a gpu worker per device started when
    gpu work waits (beat stops idle ones); Ctrl-C stops them all."""
    from core.store.redis_conn import embedded_redis
    from fleet.processes import worker_fleet

    settings = process_settings()
    with embedded_redis(settings):
        supervisor = worker_fleet(settings)
        supervisor.start_always()
        code = supervisor.run_until_signal()
    sys.exit(code)


@click.command()
@click.option("--host", default=None)
@click.option("--port", type=int, default=None)
def up(host: str | None, port: int | None) -> None:
    """Run web, beat and the fleet (cpu workers, gpu workers on demand) on this machine;
    Ctrl-C stops them all."""
    from core.store.redis_conn import embedded_redis
    from fleet.processes import full_fleet

    settings = process_settings()
    with embedded_redis(settings):
        supervisor = full_fleet(settings, host or settings.web_host, port or settings.web_port)
        click.echo(f"laneway is up: http://{host or settings.web_host}:{port or settings.web_port}")
        code = supervisor.run_until_signal()
    sys.exit(code)


@click.command()
@click.argument("node")
@click.option("--timeout", default=30.0, show_default=True)
def health(node: str, timeout: float) -> None:
    """Run the device health check (a small tensor operation) on one worker, e.g. gpu0@host."""
    import json

    from celery.utils.nodenames import worker_direct

    from core.queueing.celery_app import make_celery
    from core.store.redis_conn import redis_client

    settings = cli_settings()
    # The report comes back through Redis: one that cannot be reached is one line now
    # (the command group's), not Celery's twenty reconnection attempts and a traceback.
    redis_client(settings).ping()
    celery = make_celery(settings)
    result = celery.send_task("laneway.device_health", queue=worker_direct(node))
    try:
        report = result.get(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - a timeout or the check's own failure
        raise click.ClickException(f"{node}: no health report ({type(exc).__name__})") from None
    finally:
        # Unsubscribed now, while the interpreter is whole: left to the result's finaliser
        # at the interpreter's exit, it meets redis-py half torn down and prints a traceback.
        result.backend.remove_pending_result(result)
    click.echo(json.dumps(report))
    if not report.get("ok"):
        sys.exit(1)
