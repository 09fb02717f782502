"""A small HTTP client for the JSON API, used by `laneway submit` and `laneway demo`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import httpx

FINAL = ("succeeded", "partial", "failed", "cancelled")


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
        self, path: Path, tasks: str = "classify", labels: str | None = None
    ) -> dict[str, Any]:
        data = {"tasks": tasks}
        if labels:
            data["labels"] = labels
        with open(path, "rb") as fh:
            response = self.http.post("/v1/jobs", files={"file": (path.name, fh)}, data=data)
        return self._check(response).json()

    def job(self, job_id: str) -> dict[str, Any]:
        return self._check(self.http.get(f"/v1/jobs/{job_id}")).json()

    def results(self, job_id: str, fmt: str = "jsonl") -> list[str]:
        response = self.http.get(f"/v1/jobs/{job_id}/results", params={"format": fmt})
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


def _raise_if_dead(fleet: Any) -> None:
    if fleet is not None and fleet.dead():
        raise ClientError(f"fleet processes died: {fleet.dead()}")
