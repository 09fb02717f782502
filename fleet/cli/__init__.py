"""The `laneway` command: run each process, manage the database and accounts, submit and
follow jobs. One module per audience (accounts, inbox, processes, probes, dead letters,
jobs, status, the demo); this one holds the group and its global options.

The group imports a command's module only when that command runs (`LazyGroup`): `laneway
worker`, which every worker process starts under, then loads the process commands and not
the database models, the HTTP client or the metrics readers of the others. A service the
command cannot reach (Postgres, Redis) ends it in one line, whichever command it was."""

from __future__ import annotations

import importlib
import logging
import os

import click

from fleet.cli.common import LOG_LEVEL_ENV, unreachable_service

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


# Each command and the module that defines it, in the order `laneway --help` lists them.
COMMANDS = {
    "db": "fleet.cli.accounts", "accounts": "fleet.cli.accounts", "inbox": "fleet.cli.inbox",
    "worker": "fleet.cli.run", "web": "fleet.cli.run", "flower": "fleet.cli.run",
    "beat": "fleet.cli.run", "fleet": "fleet.cli.run", "up": "fleet.cli.run",
    "health": "fleet.cli.run", "probe": "fleet.cli.probes", "dlq": "fleet.cli.dlq",
    "submit": "fleet.cli.jobs", "jobs": "fleet.cli.jobs", "status": "fleet.cli.status",
    "demo": "fleet.cli.demo", "calibrate": "fleet.cli.plan", "plan": "fleet.cli.plan",
}  # fmt: skip


class LazyGroup(click.Group):
    """A group whose commands are imported by name when asked for (click's documented
    pattern for lazy subcommands), listed in COMMANDS' order."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        return getattr(importlib.import_module(COMMANDS[name]), name)

    def invoke(self, ctx: click.Context) -> object:
        """Run the command; a database or Redis it cannot reach ends it with one line
        naming the service (status 1), not a traceback, whichever command met it."""
        try:
            return super().invoke(ctx)
        except Exception as exc:
            message = unreachable_service(exc)
            if message is None:
                raise
            raise click.ClickException(message) from None


@click.group(cls=LazyGroup)
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


def main() -> None:
    cli(prog_name="laneway")


if __name__ == "__main__":
    main()
