"""Fair share as people see it, on the real Postgres and Redis through the web app (no
worker: chunks a test "runs" are marked done as a worker would): a waiting job's place in
its view, on its page and in its progress; each lane's share by account type on the
dashboard and in /metrics, never an account's name or job."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest
from jsonschema import Draft202012Validator

from db.intake import create_job
from db.session import session_scope
from jobs import fairshare
from jobs.planner import plan_chunks
from tests.integration.conftest import auth
from tests.integration.test_fairshare import finish_in_flight
from tests.integration.test_pages import BASE, _login


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
    assert browser.delete(f"/v1/jobs/{busy_lane['older']}", headers=auth(busy_lane["key"]))
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
