"""The documentation: a short README whose links hold, a configuration reference naming every
setting, and a site that `mkdocs build --strict` builds, and refuses with a broken link."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MKDOCS = Path(sys.executable).with_name("mkdocs")
# Markdown links [text](target), images included; http(s) targets are not ours to check.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )


def test_the_readme_is_short_and_its_links_hold():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    needed = ("make demo", "make test", "curl ", "from laneway import Client", "laneway submit")
    assert [n for n in needed if n not in readme] == []
    local = [t for t in LINK.findall(readme) if not t.startswith(("http://", "https://"))]
    assert local, "the README links to no page"
    for target in local:
        assert (ROOT / target.split("#")[0]).is_file(), target
    # Every page of the site is linked from the README.
    linked = {Path(t.split("#")[0]).name for t in local}
    assert {p.name for p in DOCS.glob("*.md")} - {"index.md"} <= linked


def test_the_readmes_client_example_is_the_tested_one():
    # tests/e2e/test_openai_sdk.py runs getting-started.md's python blocks against a fleet.
    block = re.compile(r"```python\n(.*?)```", flags=re.S)
    readme = block.findall((ROOT / "README.md").read_text())
    assert readme and readme == block.findall((DOCS / "getting-started.md").read_text())


def test_every_setting_is_in_the_configuration_reference():
    from core.config.settings import Settings

    names = set(Settings.variables())
    assert len(names) > 50 and "LANEWAY_RATE_LIMIT_ANONYMOUS" in names
    reference = (DOCS / "configuration.md").read_text()
    # One row serves each account type's variables: LANEWAY_MAX_ITEMS_<TYPE>.
    per_type = re.compile(r"_(DEMO|TRIAL|STANDARD|ENTERPRISE)$")
    names = {n if n.startswith("LANEWAY_DEADLINE_") else per_type.sub("_<TYPE>", n) for n in names}
    assert sorted(n for n in names if f"`{n}`" not in reference) == []


def test_every_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["strict"] is True

    def pages(nav: list) -> set[str]:
        found: set[str] = set()
        for entry in nav:
            for value in entry.values():
                found |= pages(value) if isinstance(value, list) else {value}
        return found

    assert pages(config["nav"]) == {p.name for p in DOCS.glob("*.md")}


def test_the_benchmarks_page_gives_each_figure_its_command_and_links_the_journal():
    page = (DOCS / "benchmarks.md").read_text()
    assert len(page.splitlines()) <= 300, "a page a user reads in five minutes"
    # Every section that shows figures (a table) names the command that reproduces them.
    sections = re.split(r"^## ", page, flags=re.M)[1:]
    assert len(sections) >= 5
    untold = [
        s.splitlines()[0]
        for s in sections
        if "\n|---" in s and "```sh" not in s and "bench/" not in s
    ]
    assert untold == []
    journal = [t for t in LINK.findall(page) if t.startswith("journal/")]
    assert journal and all((DOCS / t.split("#")[0]).is_file() for t in journal)
    # No dated journal headings on the page itself: history lives in docs/journal/.
    assert not re.search(r"^#+ .*\b(issue \d+|\d\d:\d\d)", page, flags=re.M)
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert "journal/" in config["exclude_docs"].split()


@pytest.mark.slow
@pytest.mark.skipif(not MKDOCS.exists(), reason="mkdocs is not installed (the dev extra)")
def test_the_site_builds_strict_and_a_broken_link_fails_it(tmp_path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "getting-started" / "index.html").is_file()
    assert "WARNING" not in done.stderr
    # The lab journal stays in the repository, out of the published site.
    assert (tmp_path / "site" / "benchmarks" / "index.html").is_file()
    assert not (tmp_path / "site" / "journal").exists()

    # The same site with one link to a missing anchor and one to a missing page: refused.
    copy = tmp_path / "copy"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "api.md"
    page.write_text(page.read_text() + "\n[gone](concepts.md#no-such-part) [lost](gone.md)\n")
    done = build(copy / "mkdocs.yml", tmp_path / "broken")
    assert done.returncode != 0
    assert "no-such-part" in done.stderr and "gone.md" in done.stderr
