"""The `laneway` command: run each process, manage the database and accounts, submit and
follow jobs. One module per audience (accounts, inbox, processes, probes, dead letters,
jobs, status, the demo); this one holds the group and its global options."""

from __future__ import annotations

import logging
import os

import click

from fleet.cli.accounts import accounts, db
from fleet.cli.common import LOG_LEVEL_ENV
from fleet.cli.demo import demo
from fleet.cli.dlq import dlq
from fleet.cli.inbox import inbox
from fleet.cli.jobs import jobs, submit
from fleet.cli.plan import calibrate, plan
from fleet.cli.probes import probe
from fleet.cli.run import beat, fleet, flower, health, up, web, worker
from fleet.cli.status import status

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Libraries whose INFO lines are noise at a terminal (alembic's "Context impl ...", each
# migration applied): shown only when --log-level asks for them.
QUIET_UNLESS_ASKED = ("alembic", "httpx")


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    import laneway

    try:
        server = version("laneway-server")
    except PackageNotFoundError:
        server = "unknown"
    return f"{server} (client {laneway.__version__})"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"laneway {_versions()}")
        ctx.exit()


@click.group()
@click.option(
    "--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default=None,
    help="this command's and the processes it starts (default INFO; alembic and httpx WARNING)",
)  # fmt: skip
@click.option(
    "--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
    help="print the server's and the client's versions and exit",
)  # fmt: skip
def cli(log_level: str | None) -> None:
    """Laneway: a Celery worker fleet for NLP inference."""
    from core.obs.logsafe import install_redaction

    install_redaction()
    level = (log_level or "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    if log_level is None:
        for name in QUIET_UNLESS_ASKED:
            logging.getLogger(name).setLevel(logging.WARNING)
    else:
        os.environ[LOG_LEVEL_ENV] = level  # read by the processes this command starts


for command in (db, accounts, inbox, worker, web, flower, beat, fleet, up, health, probe, dlq,
                submit, jobs, status, demo, calibrate, plan):  # fmt: skip
    cli.add_command(command)


def main() -> None:
    cli(prog_name="laneway")


if __name__ == "__main__":
    main()
