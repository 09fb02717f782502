"""The rooms' import contracts (pyproject.toml, docs/architecture.md) hold, and they catch
what a hurried change would do: an upward import, a cycle, Celery in the model code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("fleet", "webapp", "tasks", "workers", "jobs", "db", "laneway", "inference")
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
    shutil.copy(ROOT / "pyproject.toml", where / "pyproject.toml")
    return where


def test_the_tree_keeps_every_contract():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("path", "line", "broken"),
    [
        # The ground floor reaching up into a service.
        ("laneway/upward.py", "import jobs.submit\n", "Rooms import downward only"),
        # A service reaching up into a task module (the old jobs -> tasks cycle).
        ("jobs/upward.py", "from tasks import chunks\n", "Rooms import downward only"),
        # The web app importing the worker's entry module (and so torch).
        ("webapp/upward.py", "import tasks.app\n", "Rooms import downward only"),
        # Model code that learned about the queue.
        ("inference/queue.py", "import celery\n", "inference is model code only"),
        # Two modules of one room importing each other.
        ("db/loop.py", "import db.queries\n", "no cycle"),
    ],
)
def test_a_planted_import_breaks_its_contract(tree, path, line, broken):
    planted = tree / path
    original = (tree / "db" / "queries.py").read_text()
    planted.write_text(line)
    if path == "db/loop.py":
        (tree / "db" / "queries.py").write_text(original + "\nimport db.loop  # noqa\n")
    try:
        done = lint(tree)
    finally:
        planted.unlink()
        (tree / "db" / "queries.py").write_text(original)
    assert done.returncode != 0, done.stdout[-2000:]
    assert broken in done.stdout.split("Broken contracts")[-1]
