"""The rooms' import contracts (pyproject.toml, docs/architecture.md) hold, and they catch
what a hurried change would do: an upward import, a cycle, Celery in the model code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("fleet", "webapp", "tasks", "workers", "jobs", "db", "core", "inference")
# The client is a distribution of its own (client/), with a contract of its own.
CLIENT = ROOT / "client" / "laneway"
LINT = Path(sys.executable).with_name("lint-imports")


def lint(where: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(where)}
    return subprocess.run(
        [str(LINT), "--no-cache", "--no-logo"],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the rooms and the contracts, to plant imports in."""
    where = tmp_path_factory.mktemp("house")
    for room in ROOMS:
        shutil.copytree(ROOT / room, where / room, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(CLIENT, where / "laneway", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", where / "pyproject.toml")
    return where


@pytest.mark.slow
def test_the_tree_keeps_every_contract():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("path", "line", "broken"),
    [
        # The ground floor reaching up into a service.
        ("core/upward.py", "import jobs.submit\n", "Rooms import downward only"),
        # The settings reaching up into the Celery wiring.
        ("core/config/upward.py", "import core.queueing.celery_app\n", "ground floor's rooms"),
        # The light client importing the server, or torch.
        ("laneway/server.py", "import core.config.settings\n", "client knows nothing"),
        ("laneway/heavy.py", "import torch\n", "client knows nothing"),
        # A service reaching up into a task module (the old jobs -> tasks cycle).
        ("jobs/upward.py", "from tasks import chunks\n", "Rooms import downward only"),
        # The web app importing the worker's entry module (and so torch).
        ("webapp/upward.py", "import tasks.app\n", "Rooms import downward only"),
        # Model code that learned about the queue.
        ("inference/queue.py", "import celery\n", "inference is model code only"),
        # Two modules of one room importing each other.
        ("db/loop.py", "import db.results\n", "no cycle"),
    ],
)
@pytest.mark.slow
def test_a_planted_import_breaks_its_contract(tree, path, line, broken):
    planted = tree / path
    original = (tree / "db" / "results.py").read_text()
    planted.write_text(line)
    if path == "db/loop.py":
        (tree / "db" / "results.py").write_text(original + "\nimport db.loop  # noqa\n")
    try:
        done = lint(tree)
    finally:
        planted.unlink()
        (tree / "db" / "results.py").write_text(original)
    assert done.returncode != 0, done.stdout[-2000:]
    assert broken in done.stdout.split("Broken contracts")[-1]


# docs/architecture.md: "no production file over 500 lines unless the doc says why it is
# one thing"; the files it names, each with its reason there.
LONG_FILE_LINES = 500


def test_no_production_file_is_over_500_lines_unless_the_architecture_says_why():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    files = [p for room in ROOMS for p in (ROOT / room).rglob("*.py")]
    files += list(CLIENT.rglob("*.py"))
    long = {
        str(p.relative_to(ROOT)): n
        for p in files
        if "migrations" not in p.parts and (n := len(p.read_text().splitlines())) > LONG_FILE_LINES
    }
    unexplained = {path: n for path, n in long.items() if f"`{path}`" not in doc}
    assert not unexplained, (
        f"over {LONG_FILE_LINES} lines, not in docs/architecture.md: {unexplained}"
    )
