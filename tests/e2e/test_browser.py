"""The web pages in a real browser (Playwright driving Debian's chromium) against the web app
under gunicorn and a real cpu worker: sign in, submit through the form, watch the progress
bar reach 100 %, download the results and check them, open the dashboard.

With LANEWAY_SCREENSHOTS=<folder> (`make screenshots`) it also saves a picture of each page.
"""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest

from tests.e2e.procs import http, start_web
from tests.faults.harness import cpu_worker

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("LANEWAY_TEST_CHROMIUM", "/usr/bin/chromium")
SHOTS = os.environ.get("LANEWAY_SCREENSHOTS")
TEXTS = [
    "I was charged twice for my order",
    "my parcel is three days late and nobody answers",
    "thank you, the support team was wonderful",
    "the app crashes every time I open settings",
    "how do I change the email on my account?",
    "refund please, the jacket arrived torn",
] * 8  # 48 texts: three chunks of 16


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


def test_sign_in_submit_watch_download_and_see_the_fleet(browser, account_factory, tmp_path):
    account, key = account_factory("trial")  # the cpu lane
    # Plain HTTP on 127.0.0.1: the session cookie without its Secure flag.
    web, url = start_web(tmp_path, env={"LANEWAY_SECURE_COOKIES": "false"})
    worker = None
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
        page.fill("#labels", "billing, shipping, praise, bug, account, refund")
        _shot(page, "submit")
        page.click("#submit-form button[type=submit]")
        page.wait_for_url(re.compile(rf"{re.escape(url)}/jobs/[0-9a-f-]{{36}}$"))
        job_id = page.url.rsplit("/", 1)[1]
        # No worker yet: the job waits, and the page shows it live from here on.
        assert page.inner_text("#status") == "queued"
        assert page.eval_on_selector("#bar", "bar => bar.value") == 0
        assert page.locator("#download-jsonl").count() == 0

        worker = cpu_worker(tmp_path, "cpu-browser", name="cpubrowser")
        # The script polls the progress and, once the job ends, reloads the page, which then
        # has the results: nothing here navigates, so only the script can bring them.
        page.wait_for_selector("#download-jsonl")
        assert page.eval_on_selector("#bar", "bar => bar.value") == 100
        assert page.inner_text("#status") == "succeeded"
        assert page.locator("table.results tbody tr").count() == len(TEXTS)
        _shot(page, "job")

        with page.expect_download() as jsonl_download:
            page.click("#download-jsonl")
        lines = Path(jsonl_download.value.path()).read_text().splitlines()
        results = [json.loads(line) for line in lines]
        assert [r["id"] for r in results] == [str(n) for n in range(1, len(TEXTS) + 1)]
        labels = {"billing", "shipping", "praise", "bug", "account", "refund"}
        assert all(r["label"] in labels and -1 <= r["rating"] <= 1 for r in results)
        # Texts that say the same get the same answer.
        assert results[0]["label"] == results[6]["label"]
        with page.expect_download() as csv_download:
            page.click("#download-csv")
        rows = list(csv.DictReader(open(csv_download.value.path(), newline="")))
        assert [r["id"] for r in rows] == [r["id"] for r in results]
        assert [r["label"] for r in rows] == [r["label"] for r in results]

        page.goto(f"{url}/jobs")
        assert job_id[:8] in page.inner_text("table.jobs")
        _shot(page, "jobs")

        page.goto(f"{url}/dashboard")
        assert "cpubrowser@" in page.inner_text("table.workers")
        assert page.locator("figure svg").count() == 2
        assert page.locator("figure svg rect").count() > 0  # the items just done
        _shot(page, "dashboard", full_page=True)
        assert problems == []

        # The worker's own metrics reach the web app's /metrics (one folder per machine).
        text = http.get(f"{url}/metrics").text
        processed = re.search(r'^laneway_items_processed_total\{lane="cpu"\} (\S+)$', text, re.M)
        assert processed and float(processed.group(1)) >= len(TEXTS), text[:3000]
        job_count = r'^laneway_job_seconds_count\{lane="cpu",status="succeeded"\} '
        assert re.search(job_count, text, re.M)
    finally:
        context.close()
        if worker is not None:
            worker.stop()
        web.stop()
