"""The blocking client of Laneway's HTTP API (`from laneway import Client`); the CLI uses it.

A thin layer over httpx: one connection pool, the API key sent as a bearer token, typed
answers (laneway.types), errors raised as `LanewayError` naming the problem, and failures
that mean "not now" sent again under the caller's `Retry` bound (laneway.retry).
`AsyncClient` (laneway.async_client) has the same methods, awaited.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from laneway._base import (
    INLINE_JOB_TIMEOUT,
    Call,
    Calls,
    Item,
    Upload,
    http_options,
    inline_results,
    job_timed_out,
    unhealthy,
)
from laneway._base import items_body as _items  # noqa: F401 - the 0.1 name, for callers
from laneway.errors import ClientError, LanewayConnectionError, LanewayError, error_from
from laneway.retry import RETRIED_ERRORS, RETRIED_STATUSES, Attempts, Backoff, Retry
from laneway.retry import parse_retry_after as parse_retry_after
from laneway.types import FINAL, Job, JobList, Result

__all__ = ["FINAL", "Backoff", "Client", "ClientError", "LanewayError", "Retry"]


class Client(Calls):
    """Laneway's API for one account: jobs (submit, list, wait, results, cancel, retry)
    and the inline endpoints (classify, score, extract, embed, OpenAI-style embeddings).

    `base_url` and `api_key` default to LANEWAY_URL and LANEWAY_API_KEY; `retry` bounds
    the retries (`backoff` is its 0.1 name); `transport` replaces the network (e.g.
    httpx.WSGITransport(app) in tests)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        retry: Retry | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        backoff: Retry | None = None,
    ) -> None:
        self.http = httpx.Client(**http_options(base_url, api_key, timeout), transport=transport)
        self.retries = retry or backoff or Retry()
        self.sleep = sleep

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # --- transport ---------------------------------------------------------------------

    def _send(self, build: Callable[[], httpx.Request], stream: bool = False) -> httpx.Response:
        """Send, again while the answer is retryable and the `retry` bound allows; raise
        LanewayError on an error answer, LanewayConnectionError when none came."""
        attempts = Attempts(self.retries)
        while True:
            request = build()
            try:
                response = self.http.send(request, stream=stream)
            except RETRIED_ERRORS as exc:
                delay = attempts.next_delay(None)
                if delay is None:
                    raise LanewayConnectionError(str(self.http.base_url), exc) from exc
                self.sleep(delay)
                continue
            if response.status_code not in RETRIED_STATUSES:
                break
            delay = attempts.next_delay(response)
            if delay is None:
                break
            response.close()
            self.sleep(delay)
        if response.status_code >= 400:
            if stream:
                response.read()
            raise error_from(response)
        return response

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Any API call (`json=`, `params=`, `headers=`), with the retries and errors above."""
        return self._send(lambda: self.http.build_request(method, path, **kwargs))

    def _do(self, call: Call) -> Any:
        return call.parse(self.request(call.method, call.path, **call.kwargs).json())

    # --- jobs --------------------------------------------------------------------------

    def submit(
        self,
        items: Iterable[Item],
        tasks: str | Sequence[str] = "classify",
        labels: Sequence[str] | None = None,
        idempotency_key: str | None = None,
    ) -> Job:
        """Submit items as a job: texts (ids are their places), (id, text) pairs or
        {"id", "text"} objects. Sent with an Idempotency-Key (a new UUID unless given), so
        a retry after a lost answer returns the same job."""
        return self._do(self._submit_call(items, tasks, labels, idempotency_key))

    def submit_file(
        self,
        path: str | Path,
        tasks: str | Sequence[str] = "classify",
        labels: str | Sequence[str] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Job:
        """Upload a CSV (id,text) or JSONL file, optionally .gz, streamed from disk;
        `progress(sent, total)` follows the upload in bytes."""
        upload = Upload(self.http, path, tasks, labels, progress)
        try:
            return Job.parse((self._send(upload.build)).json())
        finally:
            upload.close()

    def job(self, job_id: str) -> Job:
        """The job as it is now: status, progress, counts, timings, cost."""
        return self._do(self._job_call(job_id))

    def jobs(
        self, status: str | Sequence[str] | None = None, limit: int = 20, cursor: str | None = None
    ) -> JobList:
        """A page of the caller's jobs, newest first; pass `next_cursor` for the next."""
        return self._do(self._jobs_call(status, limit, cursor))

    def iter_jobs(
        self, status: str | Sequence[str] | None = None, page: int = 100
    ) -> Iterator[Job]:
        """Every one of the caller's jobs, newest first, a page at a time."""
        cursor = None
        while True:
            listed = self.jobs(status, page, cursor)
            yield from listed
            if listed.next_cursor is None:
                return
            cursor = listed.next_cursor

    def wait(
        self,
        job_id: str,
        progress: Callable[[Job], None] | None = None,
        poll: float = 0.5,
        timeout: float | None = None,
        check: Callable[[], None] | None = None,
    ) -> Job:
        """Poll until the job ends and return it; `progress(job)` sees each poll, `check()`
        may raise to stop waiting (the demo's fleet died). TimeoutError past `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if progress is not None:
                progress(job)
            if job.ended:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise job_timed_out(job, timeout)
            if check is not None:
                check()
            time.sleep(poll)

    def results(self, job_id: str) -> Iterator[Result]:
        """The job's results, one per item, streamed as the server reads them."""
        with self._stream(f"/v1/jobs/{job_id}/results", {"format": "jsonl"}) as response:
            for line in response.iter_lines():
                if line:
                    yield Result.parse(json.loads(line))

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

    def cancel(self, job_id: str) -> Job:
        """Cancel: chunks not started are skipped, running ones stop at their next batch."""
        return self._do(self._cancel_call(job_id))

    def dead_letters(self, job_id: str) -> dict[str, Any]:
        """The job's dead letters: chunks that failed past their retries."""
        return self._do(self._dead_letters_call(job_id))

    def retry(self, job_id: str) -> dict[str, Any]:
        """Send the job's open dead letters back to run again."""
        return self._do(self._retry_call(job_id))

    def account(self) -> dict[str, Any]:
        """The caller's account: type, limits, keys (prefixes only)."""
        return self._do(self._account_call())

    # --- inline answers ----------------------------------------------------------------

    def classify(
        self,
        items: Iterable[Item],
        labels: Sequence[str] | None = None,
        wait: float | None = None,
        job_timeout: float | None = INLINE_JOB_TIMEOUT,
    ) -> list[Result]:
        """Labels for up to LANEWAY_SYNC_MAX_ITEMS items, answered inline."""
        return self._inline("classify", items, labels, wait, job_timeout)

    def score(
        self, items: Iterable[Item], wait: float | None = None,
        job_timeout: float | None = INLINE_JOB_TIMEOUT,
    ) -> list[Result]:  # fmt: skip
        """A rating in [-1, 1] per item."""
        return self._inline("score", items, None, wait, job_timeout)

    def extract(
        self, items: Iterable[Item], wait: float | None = None,
        job_timeout: float | None = INLINE_JOB_TIMEOUT,
    ) -> list[Result]:  # fmt: skip
        """Entities per item."""
        return self._inline("extract", items, None, wait, job_timeout)

    def embed(
        self, items: Iterable[Item], wait: float | None = None,
        job_timeout: float | None = INLINE_JOB_TIMEOUT,
    ) -> list[Result]:  # fmt: skip
        """A normalized embedding (and its token count) per item."""
        return self._inline("embed", items, None, wait, job_timeout)

    def _inline(
        self,
        task: str,
        items: Iterable[Item],
        labels: Sequence[str] | None,
        wait: float | None,
        job_timeout: float | None,
    ) -> list[Result]:
        """One result per item. `wait` asks the server to wait that many seconds for the
        workers (`Prefer: wait=N`); a request not answered in time became a job there
        (202): it is waited for, up to `job_timeout` seconds, and its results returned."""
        call = self._inline_call(task, items, labels, wait)
        response = self.request(call.method, call.path, **call.kwargs)
        if response.status_code == 202:
            job_id = response.json()["id"]
            self.wait(job_id, timeout=job_timeout)
            return list(self.results(job_id))
        return inline_results(response.json())

    def embeddings(
        self,
        input: str | Sequence[str],  # noqa: A002 - OpenAI's name for it
        model: str = "minilm",
        encoding_format: str = "float",
    ) -> dict[str, Any]:
        """`POST /v1/embeddings` (OpenAI's shape): {"data": [{"embedding", "index"}],
        "model", "usage"}."""
        return self._do(self._embeddings_call(input, model, encoding_format))

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
        raise unhealthy(timeout)
