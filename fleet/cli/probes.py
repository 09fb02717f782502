"""`laneway probe`: liveness checks for compose health checks and Kubernetes probes."""

from __future__ import annotations

import sys

import click

from core.store.fleet_metrics import BEAT_MAX_AGE
from fleet.cli.common import cli_settings


@click.group()
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

    _probe_exit(beat_alive(cli_settings(), max_age))


@probe.command("worker")
@click.argument("name")
@click.option("--timeout", default=10.0, show_default=True)
def probe_worker(name: str, timeout: float) -> None:
    """Worker NAME answers a ping through the broker (`cpu` means cpu@this host)."""
    from fleet.probes import node_name, worker_alive

    _probe_exit(worker_alive(cli_settings(), node_name(name), timeout))


@probe.command("http")
@click.argument("url")
@click.option("--timeout", default=5.0, show_default=True)
def probe_http(url: str, timeout: float) -> None:
    """URL answers 200 (e.g. the web app's /healthz, Flower's /healthcheck)."""
    from fleet.probes import http_alive

    _probe_exit(http_alive(url, timeout))
