"""The `laneway` group imports a command's module only when that command runs
(fleet/cli/__init__.py LazyGroup): every command is still there, by its name."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from fleet.cli import COMMANDS, cli


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_is_found_by_its_name(name):
    command = cli.get_command(click.Context(cli), name)
    assert isinstance(command, click.Command) and command.name == name


def test_help_lists_every_command_in_order_and_an_unknown_one_is_refused():
    shown = CliRunner().invoke(cli, ["--help"])
    assert shown.exit_code == 0
    listed = [line.split()[0] for line in shown.output.split("Commands:")[1].splitlines() if line]
    assert listed == list(COMMANDS)
    wrong = CliRunner().invoke(cli, ["wroker"])
    assert wrong.exit_code == 2 and "No such command 'wroker'" in wrong.output


@pytest.mark.slow
def test_the_worker_command_loads_neither_the_models_nor_the_http_client():
    """What every worker process starts under stays light (a Python child: this process
    has imported everything already)."""
    code = (
        "import sys; from fleet.cli import cli; import click; "
        "cli.get_command(click.Context(cli), 'worker'); "
        "print(sorted(m for m in ('db.models', 'httpx', 'fleet.cli.jobs') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
