"""A JSON body within the size limit but shaped to be expensive (millions of tiny arrays or
objects) is refused before it is parsed; one that is parsed stays within the stated bound
(webapp/jsonbudget.py: 20 times its size plus 64 MiB). Measured on the real web process's
peak resident memory (VmHWM)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import start_web
from webapp.jsonbudget import MEMORY_FLOOR, MEMORY_MULTIPLE, MIB

pytestmark = pytest.mark.e2e
SIZE = 8 * MIB


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def gunicorn_worker(pid: int) -> int:
    """The one process under `laneway web` with no children: gunicorn's worker."""
    leaves, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = _children(p)
        todo += kids
        if not kids and p != pid:
            leaves.append(p)
    assert len(leaves) == 1, leaves
    return leaves[0]


def peak_rss(pid: int, reset: bool = False) -> int:
    """The process's peak resident memory so far, in bytes; `reset` first brings the peak
    down to the present (Linux's clear_refs), so each body is measured on its own."""
    if reset:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def _array_of(item: bytes, size: int) -> bytes:
    n = (size - 20) // (len(item) + 1)
    return b'{"items": [' + b",".join([item] * n) + b"]}"


HOSTILE = {
    "empty arrays": _array_of(b"[]", SIZE),
    "empty objects": _array_of(b"{}", SIZE),
    "nested objects": _array_of(b'{"a":{}}', SIZE),
    "arrays in arrays": _array_of(b"[[[]]]", SIZE),
    "numbers": _array_of(b"0", SIZE),
    "deep nesting": b'{"items": ' + b"[" * (SIZE // 2) + b"]" * (SIZE // 2) + b"}",
}


def test_expensive_json_is_refused_and_parsed_json_stays_within_the_bound(
    account_factory, tmp_path
):
    _, key = account_factory("standard")
    web, url = start_web(tmp_path, {"LANEWAY_WEB_WORKERS": "1"})
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    client = httpx.Client(timeout=120, headers=headers)
    try:
        worker = gunicorn_worker(web.proc.pid)
        # Warm: the first requests import and connect what every later one uses.
        for _ in range(3):
            assert client.get(f"{url}/v1/account").status_code == 200
            assert client.post(f"{url}/v1/jobs", content=_array_of(b"[]", MIB)).status_code
        for name, body in HOSTILE.items():
            before = peak_rss(worker, reset=True)
            response = client.post(f"{url}/v1/jobs", content=body)
            grew = peak_rss(worker) - before
            assert response.status_code == 413, (name, response.text[:300])
            assert response.json()["error"] == "body_too_complex"
            assert f"{MEMORY_MULTIPLE} times its size" in response.json()["message"]
            # Never parsed: the body itself and the scan's blocks, nothing per value.
            assert grew <= 3 * len(body) + 32 * MIB, (name, grew / MIB)
        # Parsed whole (then refused for its unknown field): within the stated bound.
        text = b'{"id": "%d", "text": "my parcel came late %d"}'
        n = SIZE // len(text % (10**5, 10**5))
        parsed = b'{"items": [' + b",".join(text % (i, i) for i in range(n)) + b'], "x": 1}'
        before = peak_rss(worker, reset=True)
        response = client.post(f"{url}/v1/jobs", content=parsed)
        grew = peak_rss(worker) - before
        assert response.status_code == 400 and "unknown field 'x'" in response.text
        assert grew <= MEMORY_MULTIPLE * len(parsed) + MEMORY_FLOOR, grew / MIB
        assert web.alive()
    finally:
        client.close()
        web.stop()
