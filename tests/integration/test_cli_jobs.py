"""`laneway submit`, `jobs`, `status`, `--version`, `--json` and `--log-level`: click's runner
against the real web app served over HTTP (werkzeug in a thread) on the run's Postgres
and Redis; no HTTP is mocked. Every failure is one line and exit status 1."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from click.testing import CliRunner

from fleet.cli import cli
from fleet.cli.common import LOG_LEVEL_ENV
from tests.bombs import planted_fifo, within
from tests.e2e.procs import BIN
from tests.integration.conftest import store_results

CSV = "id,text\na,my card was charged twice\nb,the parcel never came\n"


@pytest.fixture
def laneway(served, account_factory):
    """Run `laneway ...` against the served app with a fresh account's key."""
    _, key = account_factory()

    def run(*args: str, key: str = key, input: str | bytes | None = None):  # noqa: A002
        env = {"LANEWAY_URL": served, "LANEWAY_API_KEY": key}
        return CliRunner().invoke(cli, list(args), env=env, input=input)

    return run


def _one_line_error(result, *words: str) -> None:
    assert result.exit_code == 1, result.output
    assert (
        "Traceback" not in result.output
        and result.exception is None
        or isinstance(result.exception, SystemExit)
    )
    # One line says what failed (an upload's progress label may stand above it).
    lines = [x for x in result.stderr.strip().splitlines() if not x.startswith("uploading ")]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_submit_from_standard_input_then_list_show_results_and_cancel(laneway):
    submitted = laneway("submit", "-", "--tasks", "score", input=CSV)
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.stdout.split()[1]
    assert submitted.stdout.startswith(f"job {job_id} queued on the cpu lane")
    jsonl = '{"id": "j1", "text": "hello"}\n'
    second = laneway("submit", "-", "--tasks", "embed", input=jsonl)
    assert second.exit_code == 0, second.output
    second_id = second.stdout.split()[1]

    listed = laneway("jobs", "list")
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:3] == ["id", "status", "lane"]
    assert [r.split()[0] for r in rows] == [second_id, job_id]  # newest first
    as_json = [json.loads(line) for line in laneway("jobs", "list", "--json").stdout.splitlines()]
    assert [j["id"] for j in as_json] == [second_id, job_id] and as_json[1]["items"] == 2
    one = laneway("jobs", "list", "--limit", "1")
    assert len(one.stdout.splitlines()) == 2 and "more: --cursor " in one.stderr
    cursor = one.stderr.split("--cursor ")[1].split()[0]
    rest = laneway("jobs", "list", "--limit", "1", "--cursor", cursor, "--json")
    assert [json.loads(x)["id"] for x in rest.stdout.splitlines()] == [job_id]

    shown = laneway("jobs", "show", job_id)
    assert shown.exit_code == 0 and f"job {job_id}: queued on the cpu lane" in shown.stdout
    assert "progress 0/2" in shown.stdout
    assert json.loads(laneway("jobs", "show", job_id, "--json").stdout)["tasks"] == ["score"]

    rows = [{"idx": n, "item_id": i, "output": {"rating": 0.5}} for n, i in enumerate("ab")]
    store_results(job_id, rows)
    results = laneway("jobs", "results", job_id)
    assert [json.loads(x) for x in results.stdout.splitlines()] == [
        {"id": "a", "rating": 0.5},
        {"id": "b", "rating": 0.5},
    ]
    csv_out = laneway("jobs", "results", job_id, "--format", "csv").stdout
    assert csv_out.splitlines()[0].startswith("id,") and len(csv_out.splitlines()) == 3

    cancelled = laneway("jobs", "cancel", second_id)
    assert cancelled.exit_code == 0 and cancelled.stdout.split()[2] in ("cancelling", "cancelled")
    only = laneway("jobs", "list", "--status", "queued", "--json").stdout.splitlines()
    assert [json.loads(x)["id"] for x in only] == [job_id]


def test_submit_a_file_and_an_empty_standard_input(laneway, tmp_path):
    path = tmp_path / "items.txt"
    path.write_text(CSV)
    named = laneway("submit", str(path), "--format", "csv")  # the suffix says nothing
    assert named.exit_code == 0, named.output
    _one_line_error(laneway("submit", "-", input=""), "standard input is empty")


def test_gzip_is_read_as_gzip_whatever_its_name_or_from_standard_input(laneway, tmp_path):
    """`cat items.csv.gz | laneway submit -`, or a gzip file whose name lacks .gz: the
    upload is named for what it holds (the server reads the compression from the name, and
    used to answer "name it .gz", which a pipe cannot)."""
    import gzip

    def items(result) -> int:
        assert result.exit_code == 0, result.output
        job_id = result.stdout.split()[1]
        return json.loads(laneway("jobs", "show", job_id, "--json").stdout)["progress"]["total"]

    assert items(laneway("submit", "-", input=gzip.compress(CSV.encode()))) == 2
    jsonl = (
        b'{"id": "j1", "text": "hello"}\n{"id": "j2", "text": "again"}\n{"id": "j3", "text": "x"}\n'
    )
    assert items(laneway("submit", "-", input=gzip.compress(jsonl))) == 3
    for name, args in (("items.csv", ()), ("export", ("--format", "csv"))):
        path = tmp_path / name
        path.write_bytes(gzip.compress(CSV.encode()))
        assert items(laneway("submit", str(path), *args)) == 2, name
    _one_line_error(laneway("submit", "-", input=gzip.compress(b"")), "standard input is empty")


def test_a_device_or_a_pipe_named_as_the_file_is_refused_in_one_line(laneway, tmp_path):
    """A FIFO (and a link to it, both in the test's folder) where a file is expected: no
    size to send, and opening it would wait for a writer. Refused by name, nothing sent."""
    for path in planted_fifo(tmp_path):
        with within(30):
            result = laneway("submit", str(path), "--format", "csv")
        _one_line_error(result, "not a regular file")
    assert laneway("jobs", "list", "--json").stdout == ""


def test_a_refused_connection_is_one_line(account_factory):
    env = {"LANEWAY_API_KEY": "lw_x_y", "LANEWAY_URL": "http://127.0.0.1:9"}
    for args in (["jobs", "list"], ["jobs", "show", "x"], ["submit", "-"]):
        result = CliRunner().invoke(cli, args, env=env, input=CSV)
        _one_line_error(result, "cannot reach Laneway at http://127.0.0.1:9")


def test_a_bad_key_and_a_missing_job_are_one_line(laneway):
    _one_line_error(laneway("jobs", "list", key="lw_0123456789ab_nope"), "API key was refused")
    missing = str(uuid.uuid4())
    for args in (
        ["jobs", "show", missing],
        ["jobs", "results", missing],
        ["jobs", "cancel", missing],
    ):
        _one_line_error(laneway(*args), "404", "not_found")
    _one_line_error(laneway("jobs", "show", "not-a-uuid"), "404")
    no_key = CliRunner().invoke(cli, ["jobs", "list"], env={"LANEWAY_API_KEY": ""})
    _one_line_error(no_key, "LANEWAY_API_KEY")


def test_status_shows_queues_workers_and_open_jobs(laneway):
    assert laneway("submit", "-", input=CSV).exit_code == 0
    shown = CliRunner().invoke(cli, ["status"])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.startswith("queues\n") and "workers (" in shown.stdout
    state = json.loads(CliRunner().invoke(cli, ["status", "--json"]).stdout)
    cpu = next(q for q in state["queues"] if q["queue"] == "cpu")
    assert cpu["depth"] >= 1 and {"queued", "delivered"} <= set(cpu)
    queued = [j for j in state["jobs"] if (j["status"], j["lane"]) == ("queued", "cpu")]
    assert queued and queued[0]["items"] >= 2
    assert isinstance(state["workers"], list)


def test_json_on_the_operators_tables(account_factory):
    account, _ = account_factory()
    runner = CliRunner()
    accounts = [
        json.loads(x)
        for x in runner.invoke(cli, ["accounts", "list", "--json"]).stdout.splitlines()
    ]
    mine = next(a for a in accounts if a["name"] == account.name)
    assert mine["live_keys"] == 1 and mine["admin"] is False
    keys = runner.invoke(cli, ["accounts", "keys", "list", account.name, "--json"]).stdout
    (key,) = [json.loads(x) for x in keys.splitlines()]
    assert key["prefix"].startswith("lw_") and key["state"] == "live"
    letters = runner.invoke(cli, ["dlq", "list", "--json", "--job", str(uuid.uuid4())])
    assert letters.exit_code == 0 and letters.stdout == ""


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    from importlib.metadata import version

    import laneway

    server, client = version("laneway-server"), version("laneway")
    assert result.stdout == f"laneway {server} (client {client})\n"
    assert client == laneway.__version__


def test_log_level_reaches_the_processes_laneway_starts(monkeypatch):
    from core.config.settings import Settings
    from fleet.processes import beat_argv, web_argv, worker_argv

    # Set, then removed, through monkeypatch: the command below writes the variable into
    # this process's environment, and the undo must take it away again, or every worker a
    # later test starts logs at WARNING (and never says it has loaded its models).
    monkeypatch.setenv(LOG_LEVEL_ENV, "INFO")
    monkeypatch.delenv(LOG_LEVEL_ENV)
    settings = Settings.from_env()
    assert (
        worker_argv("cpu", settings)[worker_argv("cpu", settings).index("--loglevel") + 1] == "INFO"
    )
    # `laneway --log-level warning <command>` leaves the level where its children read it.
    CliRunner().invoke(cli, ["--log-level", "warning", "probe", "http", "http://127.0.0.1:9"])
    assert os.environ[LOG_LEVEL_ENV] == "WARNING"
    for argv, flag in (
        (worker_argv("gpu", settings), "--loglevel"),
        (beat_argv(settings), "--loglevel"),
    ):
        assert argv[argv.index(flag) + 1] == "WARNING"
    web = web_argv(settings, "127.0.0.1", 8000)
    assert web[web.index("--log-level") + 1] == "warning"


def test_the_log_level_test_leaves_no_level_behind():
    # Runs after the test above (file order): the level it set must not outlive it.
    assert LOG_LEVEL_ENV not in os.environ


@pytest.mark.slow
def test_no_alembic_lines_unless_asked(migrated):
    env = {k: v for k, v in os.environ.items() if k != LOG_LEVEL_ENV}
    quiet = subprocess.run([str(BIN / "laneway"), "db", "upgrade"], env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert quiet.returncode == 0, quiet.stderr
    assert "alembic" not in quiet.stderr and quiet.stdout.startswith("database at head")
    asked = subprocess.run([str(BIN / "laneway"), "--log-level", "info", "db", "upgrade"], env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "alembic.runtime.migration" in asked.stderr


def test_every_lane_s_worker_starts_without_mingle_or_gossip():
    """Neither serves Laneway (it revokes no task, elects no leader); mingle alone holds
    each worker's start, a gpu worker's cold start too, for a second."""
    from core.config.settings import Settings
    from fleet.processes import worker_argv

    settings = Settings.from_env()
    for lane in ("cpu", "gpu", "maintenance", "interactive.cpu"):
        argv = worker_argv(lane, settings)
        assert {"--without-mingle", "--without-gossip"} <= set(argv), lane
