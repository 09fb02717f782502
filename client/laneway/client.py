"""The Python client of Laneway's HTTP API (`from laneway import Client`), used by the CLI.

It is a thin layer over httpx (already a dependency): one connection pool, the API key
sent as a bearer token, errors raised as `LanewayError` with the server's code and
message. A `429` (rate limit) or `503` (a full lane, the database away, no interactive
worker in time) is retried after the server's `Retry-After`, or with exponential
backoff where it sends none, each wait capped (`Backoff`): Laneway answers both before
storing anything, so sending again is safe.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import IO, Any

import httpx

FINAL = ("succeeded", "partial", "failed", "cancelled")
RETRIED = (429, 503)
Item = str | tuple[str, str] | dict[str, Any]


class LanewayError(RuntimeError):
    """An error answer: `status`, the server's `code` (e.g. invalid_input) and `message`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


ClientError = LanewayError  # the name the CLI used before


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """`Retry-After` in seconds: delta-seconds or an HTTP date (RFC 9110); None if absent
    or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


@dataclass(frozen=True)
class Backoff:
    """How a refused request (429, 503) is sent again: up to `retries` more times, each
    after the server's Retry-After or, without one, `base` x 2^attempt seconds; never
    longer than `cap` seconds."""

    retries: int = 5
    base: float = 0.5
    cap: float = 30.0

    def delay(self, attempt: int, retry_after: str | None) -> float:
        """Seconds to wait before retry number `attempt` (0 for the first)."""
        asked = parse_retry_after(retry_after)
        wait = asked if asked is not None else self.base * 2**attempt
        return min(self.cap, max(wait, 0.0))


class Client:
    """Laneway's API for one account: jobs (submit, wait, results, cancel, retry) and the
    inline endpoints (classify, score, extract, embed, OpenAI-style embeddings)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float = 60.0,
        backoff: Backoff | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`transport` replaces the network (e.g. httpx.WSGITransport(app) in tests)."""
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )
        self.backoff = backoff or Backoff()
        self.sleep = sleep

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # --- transport ---------------------------------------------------------------------

    def _send(self, build: Callable[[], httpx.Request], stream: bool = False) -> httpx.Response:
        """Send, waiting out 429/503 as `backoff` says; raise LanewayError on an error."""
        attempt = 0
        while True:
            response = self.http.send(build(), stream=stream)
            if response.status_code not in RETRIED or attempt >= self.backoff.retries:
                break
            delay = self.backoff.delay(attempt, response.headers.get("Retry-After"))
            response.close()
            self.sleep(delay)
            attempt += 1
        if response.status_code >= 400:
            if stream:
                response.read()
            raise _error(response)
        return response

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Any API call (`json=`, `params=`, `headers=`), with the retries and errors above."""
        return self._send(lambda: self.http.build_request(method, path, **kwargs))

    # --- jobs --------------------------------------------------------------------------

    def submit(
        self,
        items: Iterable[Item],
        tasks: str | Sequence[str] = "classify",
        labels: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Submit items as a job: texts (ids are their places), (id, text) pairs or
        {"id", "text"} objects. Returns the job (`id`, `lane`, `links`, ...)."""
        body: dict[str, Any] = {"items": _items(items), "tasks": _tasks(tasks)}
        if labels is not None:
            body["labels"] = list(labels)
        return self.request("POST", "/v1/jobs", json=body).json()

    def submit_file(
        self,
        path: str | Path,
        tasks: str | Sequence[str] = "classify",
        labels: str | Sequence[str] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, Any]:
        """Upload a CSV (id,text) or JSONL file, optionally .gz, streamed from disk;
        `progress(sent, total)` follows the upload in bytes."""
        path = Path(path)
        data = {"tasks": _tasks(tasks)}
        if labels:
            data["labels"] = labels if isinstance(labels, str) else ",".join(labels)
        total = path.stat().st_size
        opened: list[IO[bytes]] = []

        def build() -> httpx.Request:
            # Opened afresh for each attempt: a retried upload starts from its first byte.
            for fh in opened:
                fh.close()
            fh = _Counted(path.open("rb"), total, progress)
            opened.append(fh)
            files = {"file": (path.name, fh)}
            return self.http.build_request("POST", "/v1/jobs", files=files, data=data)

        try:
            return self._send(build).json()
        finally:
            for fh in opened:
                fh.close()

    def job(self, job_id: str) -> dict[str, Any]:
        """The job as it is now: status, progress, counts, timings, cost."""
        return self.request("GET", f"/v1/jobs/{job_id}").json()

    def wait(
        self,
        job_id: str,
        progress: Callable[[dict[str, Any]], None] | None = None,
        poll: float = 0.5,
        timeout: float | None = None,
        check: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until the job ends and return it; `progress(job)` sees each poll, `check()`
        may raise to stop waiting (the demo's fleet died). TimeoutError past `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if progress is not None:
                progress(job)
            if job["status"] in FINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout} s")
            if check is not None:
                check()
            time.sleep(poll)

    def results(self, job_id: str) -> Iterator[dict[str, Any]]:
        """The job's results, one record per item ({"id", ...fields} or {"id", "error"}),
        streamed as the server reads them."""
        with self._stream(f"/v1/jobs/{job_id}/results", {"format": "jsonl"}) as response:
            for line in response.iter_lines():
                if line:
                    yield json.loads(line)

    def results_csv(self, job_id: str) -> Iterator[str]:
        """The job's results as CSV text, in pieces as they arrive."""
        with self._stream(f"/v1/jobs/{job_id}/results", {"format": "csv"}) as response:
            yield from response.iter_text()

    @contextmanager
    def _stream(self, path: str, params: dict[str, str]) -> Iterator[httpx.Response]:
        response = self._send(lambda: self.http.build_request("GET", path, params=params), True)
        try:
            yield response
        finally:
            response.close()

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel: chunks not started are skipped, running ones stop at their next batch."""
        return self.request("DELETE", f"/v1/jobs/{job_id}").json()

    def dead_letters(self, job_id: str) -> dict[str, Any]:
        """The job's dead letters: chunks that failed past their retries."""
        return self.request("GET", f"/v1/jobs/{job_id}/dead-letters").json()

    def retry(self, job_id: str) -> dict[str, Any]:
        """Send the job's open dead letters back to run again."""
        return self.request("POST", f"/v1/jobs/{job_id}/retry").json()

    def account(self) -> dict[str, Any]:
        """The caller's account: type, limits, keys (prefixes only)."""
        return self.request("GET", "/v1/account").json()

    # --- inline answers ----------------------------------------------------------------

    def classify(
        self,
        items: Iterable[Item],
        labels: Sequence[str] | None = None,
        wait: float | None = None,
    ) -> list[dict[str, Any]]:
        """Labels for up to LANEWAY_SYNC_MAX_ITEMS items, answered inline."""
        return self._inline("classify", items, labels, wait)

    def score(self, items: Iterable[Item], wait: float | None = None) -> list[dict[str, Any]]:
        """A rating in [-1, 1] per item."""
        return self._inline("score", items, None, wait)

    def extract(self, items: Iterable[Item], wait: float | None = None) -> list[dict[str, Any]]:
        """Entities per item."""
        return self._inline("extract", items, None, wait)

    def embed(self, items: Iterable[Item], wait: float | None = None) -> list[dict[str, Any]]:
        """A normalized embedding (and its token count) per item."""
        return self._inline("embed", items, None, wait)

    def _inline(
        self,
        task: str,
        items: Iterable[Item],
        labels: Sequence[str] | None = None,
        wait: float | None = None,
    ) -> list[dict[str, Any]]:
        """One record per item. `wait` asks the server to wait that many seconds for the
        workers (`Prefer: wait=N`); a request not answered in time became a job there
        (202): its results are waited for and returned alike."""
        body: dict[str, Any] = {"items": _items(items)}
        if labels is not None:
            body["labels"] = list(labels)
        headers = {} if wait is None else {"Prefer": f"wait={max(0, int(wait))}"}
        response = self.request("POST", f"/v1/{task}", json=body, headers=headers)
        if response.status_code == 202:
            job_id = response.json()["id"]
            self.wait(job_id)
            return list(self.results(job_id))
        return response.json()["results"]

    def embeddings(
        self,
        input: str | Sequence[str],  # noqa: A002 - OpenAI's name for it
        model: str = "minilm",
        encoding_format: str = "float",
    ) -> dict[str, Any]:
        """`POST /v1/embeddings` (OpenAI's shape): {"data": [{"embedding", "index"}],
        "model", "usage"}."""
        body = {"input": input, "model": model, "encoding_format": encoding_format}
        return self.request("POST", "/v1/embeddings", json=body).json()

    # --- the server --------------------------------------------------------------------

    def wait_healthy(self, timeout: float = 60.0, check: Callable[[], None] | None = None) -> None:
        """Wait until /healthz answers 200 (the web app and its database are up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check is not None:
                check()
            try:
                if self.http.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise LanewayError(0, "unhealthy", f"the web app was not healthy within {timeout:.0f} s")


def _error(response: httpx.Response) -> LanewayError:
    """The server's code and message, from Laneway's or OpenAI's error shape."""
    try:
        body = response.json()
    except ValueError:
        return LanewayError(response.status_code, "http_error", response.text[:500])
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):  # OpenAI's shape (/v1/embeddings)
        return LanewayError(response.status_code, str(error.get("code")), error.get("message"))
    message = body.get("message", response.text) if isinstance(body, dict) else response.text
    return LanewayError(response.status_code, str(error or "http_error"), message)


def _tasks(tasks: str | Sequence[str]) -> str:
    return tasks if isinstance(tasks, str) else ",".join(tasks)


def _items(items: Iterable[Item]) -> list[dict[str, Any]]:
    """{"id", "text"} objects from texts, (id, text) pairs or such objects."""
    out = []
    for n, item in enumerate(items):
        if isinstance(item, str):
            out.append({"id": str(n), "text": item})
        elif isinstance(item, tuple):
            out.append({"id": item[0], "text": item[1]})
        else:
            out.append(item)
    return out


class _Counted:
    """A file whose reads report the bytes sent so far (httpx reads it in 64 KiB pieces)."""

    def __init__(
        self, fh: IO[bytes], total: int, progress: Callable[[int, int], None] | None
    ) -> None:
        self.fh, self.total, self.progress, self.sent = fh, total, progress, 0

    def read(self, size: int = -1) -> bytes:
        data = self.fh.read(size)
        self.sent += len(data)
        if self.progress is not None and data:
            self.progress(self.sent, self.total)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self.sent = self.fh.seek(offset, whence)  # httpx rewinds before it sends
        return self.sent

    def tell(self) -> int:
        return self.fh.tell()

    def fileno(self) -> int:
        return self.fh.fileno()  # httpx sizes the upload from it (Content-Length)

    def close(self) -> None:
        self.fh.close()
