"""Fair share as people see it, on the real Postgres and Redis through the web app (no
worker: chunks a test "runs" are marked done as a worker would): a waiting job's place in
its view, on its page and in its progress; each lane's share by account type on the
dashboard and in /metrics, never an account's name or job; and an account's weight
changed by the admin API or `laneway accounts weight`, followed by the next refill."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator
from sqlalchemy import select

from db.intake import create_job
from db.models import Account, Job
from db.session import session_scope
from fleet.cli import cli
from jobs import fairshare
from jobs.planner import plan_chunks
from tests.integration.conftest import auth
from tests.integration.test_fairshare import finish_in_flight, serve
from tests.integration.test_pages import BASE, _login

pytestmark = pytest.mark.usefixtures("no_worker_up")


def held_job(settings, account_id: int, n_chunks: int, chunk_size: int = 4) -> str:
    """A cpu job of the account as submission stores it: every chunk held."""
    n = n_chunks * chunk_size
    with session_scope(settings) as session:
        job = create_job(
            session,
            account_id=account_id,
            tasks=["classify"],
            labels=["a", "b"],
            items=[(f"i{k}", f"text {k}") for k in range(n)],
            lane="cpu",
            chunks=plan_chunks(n, chunk_size),
            chunk_size=chunk_size,
            held=True,
        )
        return str(job.id)


def share_of(settings, account_id: int) -> float:
    with session_scope(settings) as session:
        found = fairshare.lane_board(session, settings, "cpu").of(account_id)
    assert found is not None
    return found.share


@pytest.fixture
def busy_lane(settings, account_factory):
    """The cpu lane with an enterprise account's job (weight 4) and a standard account's
    two (weight 2): a window in flight, a window's worth done (the lane's recent
    throughput), the rest waiting."""
    other, _ = account_factory("enterprise")
    mine, key = account_factory("standard")
    theirs = held_job(settings, other.id, 30)
    older = held_job(settings, mine.id, 5)
    newer = held_job(settings, mine.id, 10)
    fairshare.refill(settings, "cpu")
    finish_in_flight(settings)
    fairshare.refill(settings, "cpu")
    return {"other": other, "mine": mine, "key": key, "theirs": theirs, "older": older,
            "newer": newer}  # fmt: skip


def test_a_waiting_jobs_view_shows_its_place_and_null_once_none_of_it_waits(
    client, settings, busy_lane
):
    with session_scope(settings) as session:
        board = fairshare.lane_board(session, settings, "cpu")
    older = client.get(f"/v1/jobs/{busy_lane['older']}", headers=auth(busy_lane["key"])).json
    newer = client.get(f"/v1/jobs/{busy_lane['newer']}", headers=auth(busy_lane["key"])).json
    place = newer["queue"]
    assert set(place) == {"waiting_chunks", "waiting_items", "chunks_ahead", "share",
                          "lane_items_per_second", "estimated_start", "estimated_end"}  # fmt: skip
    assert place["waiting_chunks"] == 10  # the account's older job goes first
    assert place["waiting_items"] == 40
    assert place["share"] == round(2 / 6, 4)  # standard 2 among enterprise 4 + standard 2
    # Ahead of its next chunk: the lane's in flight, and its account's older job's waiting.
    assert older["queue"] is not None
    assert place["chunks_ahead"] == board.in_flight_chunks + older["queue"]["waiting_chunks"]
    assert place["lane_items_per_second"] > 0
    end = datetime.fromisoformat(place["estimated_end"])
    assert end > datetime.fromisoformat(place["estimated_start"])
    assert busy_lane["other"].name not in json.dumps(newer)
    # As documented: the fuzz test's jobs seldom wait, so this one is checked here.
    document = client.get("/openapi.json").json
    job_schema = {"$ref": "#/components/schemas/Job", "components": document["components"]}
    Draft202012Validator(job_schema).validate(newer)

    cancelled = client.delete(f"/v1/jobs/{busy_lane['newer']}", headers=auth(busy_lane["key"]))
    assert cancelled.status_code in (200, 202)
    again = client.get(f"/v1/jobs/{busy_lane['newer']}", headers=auth(busy_lane["key"])).json
    assert again["status"] in ("cancelling", "cancelled") and again["queue"] is None


def test_the_job_page_and_its_progress_show_the_place(app, settings, busy_lane):
    browser = app.test_client()
    assert _login(browser, busy_lane["key"]).status_code == 303
    html = browser.get(f"/jobs/{busy_lane['newer']}", base_url=BASE).data.decode()
    shown = re.search(r'<p id="queue">(.*?)</p>', html, re.S)
    assert shown, html[:3000]
    text = " ".join(shown.group(1).split())
    assert "Waiting for a slot on the cpu lane: 10 chunks (40 items)" in text
    assert "this account's share of the lane: 33.3 %" in text
    assert re.search(r"Estimated start \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, end ", text), text
    progress = browser.get(f"/jobs/{busy_lane['newer']}/progress", base_url=BASE).json
    assert progress["queue"]["waiting_chunks"] == 10 and progress["queue"]["share"] == 0.3333
    assert busy_lane["other"].name not in html
    # A job none of whose chunks waits shows no place: the paragraph stays, hidden and
    # empty, for the script to fill or keep hidden.
    cancelled = browser.delete(f"/v1/jobs/{busy_lane['older']}", headers=auth(busy_lane["key"]))
    assert cancelled.status_code in (200, 202)
    ended = browser.get(f"/jobs/{busy_lane['older']}", base_url=BASE).data.decode()
    assert '<p id="queue" hidden></p>' in ended
    assert browser.get(f"/jobs/{busy_lane['older']}/progress", base_url=BASE).json["queue"] is None


def test_the_dashboard_shows_each_lanes_share_by_type_to_everyone_and_no_account(
    app, settings, busy_lane, account_factory
):
    for is_admin in (False, True):
        browser = app.test_client()
        _, key = account_factory("trial", is_admin=is_admin)
        assert _login(browser, key).status_code == 303
        html = browser.get("/dashboard", base_url=BASE).data.decode()
        table = re.search(r'<table class="shares" id="share-cpu">(.*?)</table>', html, re.S)
        assert table, html[:3000]
        rows = re.findall(r"<tr><td>(\w+)</td><td>([\d.]+) %</td><td>(\d+)</td><td>(\d+)</td>",
                          table.group(1))  # fmt: skip
        with session_scope(settings) as session:
            types = fairshare.lane_board(session, settings, "cpu").by_type()
        assert {r[0]: float(r[1]) for r in rows} == {"enterprise": 66.7, "standard": 33.3}
        for kind, _, flying, waiting in rows:
            assert (int(flying), int(waiting)) == (
                types[kind]["in_flight_items"],
                types[kind]["waiting_items"],
            )
        assert "No work on this lane." in html  # the gpu lane
        for secret in (busy_lane["other"].name, busy_lane["mine"].name, busy_lane["theirs"],
                       busy_lane["older"], busy_lane["newer"]):  # fmt: skip
            assert secret not in html


def _sample(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    assert match, f"{sample} not in\n{text[:3000]}"
    return float(match.group(1))


def test_metrics_show_each_lanes_share_by_type_and_its_window(client, settings, busy_lane):
    text = client.get("/metrics").text
    with session_scope(settings) as session:
        board = fairshare.lane_board(session, settings, "cpu")
    types = board.by_type()
    for kind in ("enterprise", "standard"):
        labels = f'{{account_type="{kind}",lane="cpu"}}'  # the exposition sorts them
        assert _sample(text, f"laneway_lane_share{labels}") == pytest.approx(types[kind]["share"])
        assert (
            _sample(text, f"laneway_lane_in_flight_items{labels}") == types[kind]["in_flight_items"]
        )
        assert _sample(text, f"laneway_lane_waiting_items{labels}") == types[kind]["waiting_items"]
    assert _sample(text, 'laneway_lane_share{account_type="enterprise",lane="cpu"}') == (
        pytest.approx(4 / 6)
    )
    # A type with no work, and a lane with none, still have their series (at 0).
    assert _sample(text, 'laneway_lane_share{account_type="trial",lane="cpu"}') == 0
    assert _sample(text, 'laneway_lane_waiting_items{account_type="standard",lane="gpu"}') == 0
    assert _sample(text, 'laneway_lane_window{lane="cpu"}') == board.window
    for secret in (busy_lane["other"].name, busy_lane["mine"].name, busy_lane["newer"]):
        assert secret not in text


def admin_patch(client, key: str, account_id: int, body: str):
    return client.patch(
        f"/v1/admin/accounts/{account_id}",
        data=body,
        headers={**auth(key), "Content-Type": "application/json"},
    )


# JSON bodies no weight may be; Python's json reads NaN, Infinity and 1e999 (as inf) too.
HOSTILE_WEIGHTS = ('"3"', "-1", "0", "0.0001", "1000.5", "NaN", "Infinity", "-Infinity",
                   "1e999", "1" + "0" * 400, "true", "false", "[]", "{}", '""')  # fmt: skip


def test_an_admin_changes_a_weight_and_the_next_refill_follows_it(
    client, settings, account_factory
):
    _, admin_key = account_factory(is_admin=True)
    heavy, _ = account_factory("standard")
    light, light_key = account_factory("standard")
    held_job(settings, heavy.id, 40)
    held_job(settings, light.id, 40)
    assert share_of(settings, heavy.id) == 0.5

    changed = admin_patch(client, admin_key, heavy.id, '{"share_weight": 6}')
    assert changed.status_code == 200, changed.json
    assert (changed.json["share_weight"], changed.json["share_weight_is_default"]) == (6, False)
    # The next refill reads it: no restart, no cache to clear. 6 against 2: three quarters.
    assert share_of(settings, heavy.id) == 0.75
    got = serve(settings, 8)
    with session_scope(settings) as session:
        by_account = {session.get(Job, job_id).account_id: n for job_id, n in got.items()}
    assert (by_account[heavy.id], by_account[light.id]) == (24, 8)

    listed = client.get("/v1/admin/accounts", headers=auth(admin_key)).json["accounts"]
    shown = {a["id"]: (a["share_weight"], a["share_weight_is_default"]) for a in listed}
    assert shown[heavy.id] == (6, False) and shown[light.id] == (2, True)

    back = admin_patch(client, admin_key, heavy.id, '{"share_weight": null}')
    assert back.status_code == 200
    assert (back.json["share_weight"], back.json["share_weight_is_default"]) == (2, True)
    assert share_of(settings, heavy.id) == 0.5

    for edge in (1000, 0.001):
        assert (
            admin_patch(client, admin_key, heavy.id, f'{{"share_weight": {edge}}}').json[
                "share_weight"
            ]
            == edge
        )
    assert admin_patch(client, admin_key, heavy.id, '{"share_weight": null}').status_code == 200
    for hostile in HOSTILE_WEIGHTS:
        refused = admin_patch(client, admin_key, heavy.id, f'{{"share_weight": {hostile}}}')
        assert refused.status_code == 400, hostile
        assert (
            refused.json["error"] == "invalid_input" and "share_weight" in refused.json["message"]
        ), hostile
    with session_scope(settings) as session:
        assert session.get(Account, heavy.id).share_weight is None  # nothing stored

    # Not an admin (its own account or another's), or no key: as the admin API refuses.
    for target in (light.id, heavy.id):
        denied = admin_patch(client, light_key, target, '{"share_weight": 1000}')
        assert denied.status_code == 403 and denied.json["error"] == "forbidden"
    assert client.patch(f"/v1/admin/accounts/{light.id}", json={"share_weight": 9}).status_code == (
        401
    )
    with session_scope(settings) as session:
        assert session.get(Account, light.id).share_weight is None


def _weight_of(name: str) -> float | None:
    with session_scope() as session:
        return session.scalar(select(Account.share_weight).where(Account.name == name))


def test_cli_sets_and_clears_a_weight_and_refuses_what_is_no_weight(settings, account_factory):
    account, _ = account_factory("enterprise")
    name = account.name
    runner = CliRunner()

    def listed() -> str:
        out = runner.invoke(cli, ["accounts", "list"]).output
        return next(line for line in out.splitlines() if name in line)

    assert "4 (type)" in listed()
    done = runner.invoke(cli, ["accounts", "weight", name, "2.5"])
    assert done.exit_code == 0 and "2.5" in done.output
    assert _weight_of(name) == 2.5 and "2.5" in listed() and "(type)" not in listed()
    rows = [json.loads(line) for line in runner.invoke(cli, ["accounts", "list", "--json"]).output
            .splitlines()]  # fmt: skip
    mine = next(r for r in rows if r["name"] == name)
    assert (mine["weight"], mine["weight_is_default"]) == (2.5, False)

    assert runner.invoke(cli, ["accounts", "weight", name, "default"]).exit_code == 0
    assert _weight_of(name) is None and "4 (type)" in listed()
    assert runner.invoke(cli, ["accounts", "weight", name, "7"]).exit_code == 0
    assert runner.invoke(cli, ["accounts", "weight", name, "--clear"]).exit_code == 0
    assert _weight_of(name) is None

    for hostile in ("-1", "0", "0.0001", "1000.5", "nan", "inf", "-inf", "1e999", "abc", "",
                    "0x10", "1" + "0" * 400):  # fmt: skip
        refused = runner.invoke(cli, ["accounts", "weight", name, hostile])
        assert refused.exit_code == 1, (hostile, refused.output)
        assert refused.output.count("\n") == 1 and refused.output.startswith("Error:"), hostile
    assert _weight_of(name) is None
    assert runner.invoke(cli, ["accounts", "weight", name]).exit_code == 2  # WEIGHT or --clear
    assert runner.invoke(cli, ["accounts", "weight", name, "3", "--clear"]).exit_code == 2
    missing = runner.invoke(cli, ["accounts", "weight", f"ghost-{uuid.uuid4().hex[:6]}", "3"])
    assert missing.exit_code == 1 and "no account" in missing.output
