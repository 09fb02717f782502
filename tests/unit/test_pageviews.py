"""The pages' shaping: the progress bar's ETA, page numbers, an item's text shortened, and
the SVG charts."""

from __future__ import annotations

from webapp import charts
from webapp.jobviews import Page, page_number, progress, shorten


def _view(status, done, total, started="2026-01-01T00:00:00+00:00"):
    percent = round(100.0 * done / total, 1) if total else 100.0
    return {
        "status": status,
        "progress": {"done": done, "total": total, "percent": percent},
        "timings": {"started_at": started},
    }


def test_the_eta_follows_the_pace_so_far():
    now = "2026-01-01T00:00:10+00:00"
    assert progress(_view("running", 25, 100), now)["eta_seconds"] == 30.0
    assert progress(_view("running", 0, 100), now)["eta_seconds"] is None  # no pace yet
    assert progress(_view("queued", 0, 100, None), now)["eta_seconds"] is None
    ended = progress(_view("succeeded", 100, 100), now)
    assert ended["final"] and ended["eta_seconds"] is None and ended["percent"] == 100.0


def test_page_numbers_and_pages():
    assert [page_number(x) for x in (None, "", "3", "0", "-1", "x", "9" * 12)] == [
        1, 1, 3, 1, 1, 1, 1,
    ]  # fmt: skip
    page = Page(rows=[], number=2, per_page=25, total=51)
    assert (page.pages, page.has_prev, page.has_next) == (3, True, True)
    assert Page([], 1, 25, 0).pages == 1 and not Page([], 1, 25, 0).has_next


def test_charts_are_plain_svg_with_escaped_text():
    svg = charts.grouped_bars({"cpu": [0, 10, 5], "gpu": [0, 0, 20]}, ["a", "b", "c"], "T<x>", "n")
    assert svg.startswith("<svg") and svg.count("<rect") >= 6
    assert "T&lt;x&gt;" in svg and "T<x>" not in svg
    assert "style=" not in svg and "<script" not in svg  # nothing the CSP blocks
    empty = charts.grouped_bars({"cpu": [0] * 12, "gpu": [0] * 12}, [""] * 12, "t", "n")
    assert "NaN" not in empty and "inf" not in empty
    cost = charts.bars({"cpu": 2e-6, "gpu": None}, "cost", "${:.2e}")
    assert "$2.00e-06" in cost and "no items in the last hour" in cost


def test_a_text_is_shortened_to_the_limit_with_an_ellipsis():
    assert shorten("") == "" and shorten("x" * 200) == "x" * 200
    cut = shorten("x" * 201)
    assert len(cut) == 200 and cut.endswith("x\u2026")
    # Space before the cut goes, so the ellipsis follows a word.
    assert shorten("a" * 198 + "  tail") == "a" * 198 + "\u2026"
    assert shorten("\U0001f600" * 300, chars=10) == "\U0001f600" * 9 + "\u2026"
