"""The web pages in a real browser (Playwright driving Debian's chromium) against the web app
under gunicorn, a real cpu worker and a real interactive worker: sign in, submit through
the form, watch the progress bar stop part-way with an ETA while a chunk is held, then reach
100 %, download the results and check each item's label, open the dashboard and find the
work just done in its charts, and find the workers' own metrics on /metrics.

With LANEWAY_SCREENSHOTS=<folder> (`make screenshots`) it also saves a picture of each page.
"""

from __future__ import annotations

import csv
import json
import os
import re
import socket
from pathlib import Path

import pytest

from core.util.faults import stall_file
from core.vocab import STALL_MARKER
from tests.e2e.procs import BIN, Proc, http, start_web, wait_for, worker_ready
from tests.faults.harness import cpu_worker

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("LANEWAY_TEST_CHROMIUM", "/usr/bin/chromium")
SHOTS = os.environ.get("LANEWAY_SCREENSHOTS")
LABELS = ("billing", "shipping")
# Texts whose label is not in doubt (the zero-shot model gives each a clear margin).
SAID = [
    ("I was charged twice on my credit card", "billing"),
    ("my invoice shows the wrong amount", "billing"),
    ("please refund the duplicate payment on my bill", "billing"),
    ("why is there an extra fee on my monthly statement", "billing"),
    ("my parcel has not been delivered yet", "shipping"),
    ("the courier lost my package", "shipping"),
    ("when will my order be shipped", "shipping"),
    ("the delivery truck never arrived with my parcel", "shipping"),
] * 6  # 48 texts: three chunks of 16
# The last text carries the stall marker: with LANEWAY_FAULTS=stall the third chunk waits
# while the stall file exists, so the page can be seen part-way.
TEXTS = [text for text, _ in SAID[:-1]] + [f"{SAID[-1][0]} {STALL_MARKER}"]
EXPECTED = [label for _, label in SAID]


@pytest.fixture
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no browser at {CHROMIUM}: run `make chromium` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # Root (CI) cannot use chromium's sandbox.
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def _shot(page, name: str, full_page: bool = False) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=full_page)


def _metric(text: str, sample: str) -> float:
    """A sample's value on /metrics; 0 when no process has recorded it yet."""
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


WORKER_SAMPLES = (
    'laneway_items_processed_total{lane="cpu"}',
    'laneway_job_seconds_count{lane="cpu",status="succeeded"}',
    'laneway_items_processed_total{lane="interactive.cpu"}',
)


def _worker_metrics(url: str) -> dict[str, float]:
    text = http.get(f"{url}/metrics").text
    return {sample: _metric(text, sample) for sample in WORKER_SAMPLES}


def _count(shown: str) -> float:
    """A bar's count as its title writes it (webapp/charts.py: 1,100 is `1.1k`); the run's
    other tests share the chart's 5 minutes, so a count may well pass a thousand."""
    shown = shown.strip()
    return float(shown[:-1]) * 1000 if shown.endswith("k") else float(shown)


def _bars(page, chart: str, series: str) -> list[dict]:
    """Each bar a chart draws for a series: its height, width and the value it shows."""
    return page.eval_on_selector_all(
        f'#{chart} rect.bar[data-series="{series}"]',
        """rects => rects.map(r => ({
            height: parseFloat(r.getAttribute("height")),
            width: parseFloat(r.getAttribute("width")),
            title: r.textContent,
        }))""",
    )


def test_sign_in_submit_watch_download_and_see_the_fleet(
    browser, account_factory, settings, tmp_path
):
    from playwright.sync_api import expect

    account, key = account_factory("trial")  # the cpu lane
    # Plain HTTP on 127.0.0.1: the session cookie without its Secure flag.
    web, url = start_web(tmp_path, env={"LANEWAY_SECURE_COOKIES": "false"})
    # Loads its model while the job is submitted; waited for before its request.
    interactive = Proc(
        "interactive-browser",
        [str(BIN / "laneway"), "worker", "interactive", "--name", "interactivebrowser"],
        tmp_path,
    )
    worker = None
    stall = stall_file(settings)
    # Every process of this test session writes into the same metrics folder: what the
    # workers add is told from what the run had before them.
    before = _worker_metrics(url)
    context = browser.new_context(accept_downloads=True, viewport={"width": 1200, "height": 800})
    page = context.new_page()
    problems: list[str] = []
    # A script blocked by the CSP, or one that throws, shows up here.
    page.on("console", lambda m: m.type == "error" and problems.append(m.text))
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"{r.status} {r.url}"))
    page.set_default_timeout(60_000)
    try:
        page.goto(f"{url}/login")
        _shot(page, "login")
        page.fill("#api_key", key)
        page.click("button[type=submit]")
        page.wait_for_url(f"{url}/")
        assert account.name in page.inner_text("h1")

        page.goto(f"{url}/submit")
        page.fill("#texts", "\n".join(TEXTS))
        page.check("input[value=score]")
        page.fill("#labels", ", ".join(LABELS))
        _shot(page, "submit")
        page.click("#submit-form button[type=submit]")
        page.wait_for_url(re.compile(rf"{re.escape(url)}/jobs/[0-9a-f-]{{36}}$"))
        job_id = page.url.rsplit("/", 1)[1]
        # No worker yet: the job waits, and the page shows it live from here on.
        assert page.inner_text("#status") == "queued"
        assert page.eval_on_selector("#bar", "bar => bar.value") == 0
        assert page.locator("#download-jsonl").count() == 0
        assert page.inner_text("#eta") == ""
        # Gone if the page reloads: whatever shows up next, the page's script brought.
        page.evaluate("window.notReloaded = true")

        stall.touch()
        worker = cpu_worker(
            tmp_path, "cpu-browser", name="cpubrowser", env={"LANEWAY_FAULTS": "stall"}
        )
        # The first two chunks finish; the third is held: 32 of 48 items, and an ETA.
        expect(page.locator("#done")).to_have_text("32", timeout=120_000)
        expect(page.locator("#eta")).to_have_text(re.compile(r"^about \d+ s left$"))
        expect(page.locator("#status")).to_have_text("running")
        assert page.eval_on_selector("#bar", "bar => bar.value") == pytest.approx(66.7, abs=0.1)
        assert page.inner_text("#percent") == "66.7 %"
        assert page.evaluate("window.notReloaded") is True
        _shot(page, "job-running")
        stall.unlink()
        # Once the job ends the script reloads the page, which then has the results:
        # nothing here navigates, so only the script can bring them.
        page.wait_for_selector("#download-jsonl")
        assert page.eval_on_selector("#bar", "bar => bar.value") == 100
        assert page.inner_text("#status") == "succeeded" and page.inner_text("#eta") == ""
        assert page.locator("table.results tbody tr").count() == len(TEXTS)
        # Each answer beside its text, as a person reads the page.
        first = page.locator("table.results tbody tr").first.locator("td")
        assert [first.nth(n).inner_text() for n in range(3)] == ["1", TEXTS[0], EXPECTED[0]]
        _shot(page, "job")

        with page.expect_download() as jsonl_download:
            page.click("#download-jsonl")
        lines = Path(jsonl_download.value.path()).read_text().splitlines()
        results = [json.loads(line) for line in lines]
        assert [r["id"] for r in results] == [str(n) for n in range(1, len(TEXTS) + 1)]
        assert [r["label"] for r in results] == EXPECTED
        assert all(-1 <= r["rating"] <= 1 and "error" not in r for r in results)
        with page.expect_download() as csv_download:
            page.click("#download-csv")
        rows = list(csv.DictReader(open(csv_download.value.path(), newline="")))
        assert [r["id"] for r in rows] == [r["id"] for r in results]
        assert [r["label"] for r in rows] == EXPECTED

        page.goto(f"{url}/jobs")
        assert job_id[:8] in page.inner_text("table.jobs")
        _shot(page, "jobs")

        # An interactive request, for the dashboard's interactive lane.
        node = f"interactivebrowser@{socket.gethostname()}"
        wait_for(worker_ready(interactive, node), 120, "the interactive worker", [interactive])
        answer = http.post(
            f"{url}/v1/classify",
            json={"items": [{"id": "a", "text": SAID[1][0]}, {"id": "b", "text": SAID[5][0]}],
                  "labels": list(LABELS)},
            headers={"Authorization": f"Bearer {key}"},
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert [r["label"] for r in answer.json()["results"]] == ["billing", "shipping"]

        # The workers' own metrics reach the web app's /metrics (one folder per machine);
        # the interactive worker records its batch once the answer is out.
        def workers_recorded() -> dict[str, float] | None:
            now = _worker_metrics(url)
            added = {sample: now[sample] - before[sample] for sample in WORKER_SAMPLES}
            return added if added[WORKER_SAMPLES[2]] > 0 else None

        added = wait_for(workers_recorded, 30, "the interactive batch's metrics", [interactive])
        assert list(added.values()) == [len(TEXTS), 1, 2]

        page.goto(f"{url}/dashboard")
        workers = page.inner_text("table.workers")
        assert "cpubrowser@" in workers and "interactivebrowser@" in workers
        assert page.locator("figure svg").count() == 2
        # The current 5 minutes of the throughput chart hold the work just done, for both
        # lanes, and the cost chart prices both.
        for series, items in (("cpu", len(TEXTS)), ("interactive.cpu", 2)):
            now = _bars(page, "throughput", series)[-1]
            shown = _count(now["title"].rsplit(":", 1)[1])
            assert now["height"] > 0 and shown >= items, now
            (cost,) = _bars(page, "cost", series)
            assert cost["width"] > 0, cost
        _shot(page, "dashboard", full_page=True)
        assert problems == []
    finally:
        stall.unlink(missing_ok=True)
        context.close()
        if worker is not None:
            worker.stop()
        interactive.stop()
        web.stop()
