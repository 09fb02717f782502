"""A small HTTP client for the JSON API, used by `laneway submit` and `laneway demo`."""

from __future__ import annotations

import io
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import click
import httpx

FINAL = ("succeeded", "partial", "failed", "cancelled")
# A GET refused for the account's rate limit waits out Retry-After this many times at most.
RATE_LIMIT_WAITS = 5


class ClientError(RuntimeError):
    pass


class Client:
    def __init__(self, base_url: str, api_key: str, timeout: float = 60.0) -> None:
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
        )

    def _check(self, response: httpx.Response) -> httpx.Response:
        if response.status_code >= 400:
            try:
                message = response.json().get("message", response.text)
            except ValueError:
                message = response.text
            raise ClientError(f"{response.status_code}: {message}")
        return response

    def submit_file(
        self,
        path: Path,
        tasks: str = "classify",
        labels: str | None = None,
        progress: bool = False,
    ) -> dict[str, Any]:
        """Upload a CSV or JSONL file (optionally .gz), streamed from disk; with progress,
        a bar follows the upload."""
        data = {"tasks": tasks}
        if labels:
            data["labels"] = labels
        bar = (
            click.progressbar(
                length=path.stat().st_size,
                label=f"uploading {path.name}",
                file=click.get_text_stream("stderr"),
            )
            if progress
            else nullcontext()
        )
        with bar as shown, _Counted(io.FileIO(path), shown) as fh:
            response = self.http.post("/v1/jobs", files={"file": (path.name, fh)}, data=data)
        return self._check(response).json()

    def _get(self, path: str, **kwargs: Any) -> httpx.Response:
        """A GET that waits out a 429 (Retry-After) and asks again: polling a long job
        must not fail because a demo account's limit is low."""
        for _ in range(RATE_LIMIT_WAITS):
            response = self.http.get(path, **kwargs)
            if response.status_code != 429:
                break
            try:
                wait = float(response.headers.get("Retry-After", "1"))
            except ValueError:
                wait = 1.0
            time.sleep(min(max(wait, 0.1), 60.0))
        return response

    def job(self, job_id: str) -> dict[str, Any]:
        return self._check(self._get(f"/v1/jobs/{job_id}")).json()

    def results(self, job_id: str, fmt: str = "jsonl") -> list[str]:
        response = self._get(f"/v1/jobs/{job_id}/results", params={"format": fmt})
        return self._check(response).text.splitlines()

    def wait_healthy(self, timeout: float = 60.0, fleet: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _raise_if_dead(fleet)
            try:
                if self.http.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise ClientError(f"the web app did not become healthy within {timeout:.0f} s")

    def wait(
        self, job_id: str, progress: bool = False, poll: float = 0.5, fleet: Any = None
    ) -> dict[str, Any]:
        """Poll until the job ends; with progress, draw a progress bar on the terminal."""
        job = self.job(job_id)
        if not progress:
            while job["status"] not in FINAL:
                _raise_if_dead(fleet)
                time.sleep(poll)
                job = self.job(job_id)
            return job
        total = job["progress"]["total"]
        with click.progressbar(
            length=total,
            label=f"job {job_id[:8]}",
            show_eta=True,
            show_pos=True,
            file=click.get_text_stream("stderr"),
        ) as bar:
            shown = 0
            while True:
                done = job["progress"]["done"]
                bar.update(done - shown)
                shown = done
                if job["status"] in FINAL:
                    return job
                _raise_if_dead(fleet)
                time.sleep(poll)
                job = self.job(job_id)


class _Counted(io.BufferedReader):
    """A file whose reads move a progress bar (httpx sends a file in 64 KiB reads)."""

    def __init__(self, raw: io.FileIO, bar: Any) -> None:
        super().__init__(raw)
        self.bar = bar

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        if self.bar is not None:
            self.bar.update(len(data))
        return data


def _raise_if_dead(fleet: Any) -> None:
    if fleet is not None and fleet.dead():
        raise ClientError(f"fleet processes died: {fleet.dead()}")
