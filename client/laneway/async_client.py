"""`AsyncClient`: the methods of `Client`, awaited (httpx.AsyncClient underneath).

Requests are built and answers parsed by the code the blocking client uses
(laneway._base); only sending, sleeping and streaming differ.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
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
from laneway.errors import LanewayConnectionError, error_from
from laneway.retry import RETRIED_ERRORS, RETRIED_STATUSES, Attempts, Retry
from laneway.types import Job, JobList, Result


class AsyncClient(Calls):
    """Laneway's API for one account, for asyncio code: `await client.submit(...)`,
    `async for record in client.results(job.id)`. Arguments as `Client`'s."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        retry: Retry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        options = http_options(base_url, api_key, timeout)
        self.http = httpx.AsyncClient(**options, transport=transport)
        self.retries = retry or Retry()
        self.sleep = sleep

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def _send(
        self, build: Callable[[], httpx.Request], stream: bool = False
    ) -> httpx.Response:
        attempts = Attempts(self.retries)
        while True:
            try:
                response = await self.http.send(build(), stream=stream)
            except RETRIED_ERRORS as exc:
                delay = attempts.next_delay(None)
                if delay is None:
                    raise LanewayConnectionError(str(self.http.base_url), exc) from exc
                await self.sleep(delay)
                continue
            if response.status_code not in RETRIED_STATUSES:
                break
            delay = attempts.next_delay(response)
            if delay is None:
                break
            await response.aclose()
            await self.sleep(delay)
        if response.status_code >= 400:
            if stream:
                await response.aread()
            raise error_from(response)
        return response

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self._send(lambda: self.http.build_request(method, path, **kwargs))

    async def _do(self, call: Call) -> Any:
        return call.parse((await self.request(call.method, call.path, **call.kwargs)).json())

    # --- jobs --------------------------------------------------------------------------

    async def submit(
        self,
        items: Iterable[Item],
        tasks: str | Sequence[str] = "classify",
        labels: Sequence[str] | None = None,
        idempotency_key: str | None = None,
    ) -> Job:
        return await self._do(self._submit_call(items, tasks, labels, idempotency_key))

    async def submit_file(
        self,
        path: str | Path,
        tasks: str | Sequence[str] = "classify",
        labels: str | Sequence[str] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Job:
        upload = Upload(self.http, path, tasks, labels, progress)
        try:
            return Job.parse((await self._send(upload.build)).json())
        finally:
            upload.close()

    async def job(self, job_id: str) -> Job:
        return await self._do(self._job_call(job_id))

    async def jobs(
        self, status: str | Sequence[str] | None = None, limit: int = 20, cursor: str | None = None
    ) -> JobList:
        return await self._do(self._jobs_call(status, limit, cursor))

    async def iter_jobs(
        self, status: str | Sequence[str] | None = None, page: int = 100
    ) -> AsyncIterator[Job]:
        cursor = None
        while True:
            listed = await self.jobs(status, page, cursor)
            for job in listed:
                yield job
            if listed.next_cursor is None:
                return
            cursor = listed.next_cursor

    async def wait(
        self,
        job_id: str,
        progress: Callable[[Job], None] | None = None,
        poll: float = 0.5,
        timeout: float | None = None,
        check: Callable[[], None] | None = None,
    ) -> Job:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = await self.job(job_id)
            if progress is not None:
                progress(job)
            if job.ended:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise job_timed_out(job, timeout)
            if check is not None:
                check()
            await asyncio.sleep(poll)

    async def results(self, job_id: str) -> AsyncIterator[Result]:
        async for line in self._lines(f"/v1/jobs/{job_id}/results", {"format": "jsonl"}):
            if line:
                yield Result.parse(json.loads(line))

    async def results_csv(self, job_id: str) -> AsyncIterator[str]:
        path, params = f"/v1/jobs/{job_id}/results", {"format": "csv"}
        response = await self._send(
            lambda: self.http.build_request("GET", path, params=params), True
        )
        try:
            async for text in response.aiter_text():
                yield text
        finally:
            await response.aclose()

    async def _lines(self, path: str, params: dict[str, str]) -> AsyncIterator[str]:
        response = await self._send(
            lambda: self.http.build_request("GET", path, params=params), True
        )
        try:
            async for line in response.aiter_lines():
                yield line
        finally:
            await response.aclose()

    async def cancel(self, job_id: str) -> Job:
        return await self._do(self._cancel_call(job_id))

    async def dead_letters(self, job_id: str) -> dict[str, Any]:
        return await self._do(self._dead_letters_call(job_id))

    async def retry(self, job_id: str) -> dict[str, Any]:
        return await self._do(self._retry_call(job_id))

    async def account(self) -> dict[str, Any]:
        return await self._do(self._account_call())

    # --- inline answers ----------------------------------------------------------------

    async def classify(
        self,
        items: Iterable[Item],
        labels: Sequence[str] | None = None,
        wait: float | None = None,
        job_timeout: float | None = INLINE_JOB_TIMEOUT,
    ) -> list[Result]:
        return await self._inline("classify", items, labels, wait, job_timeout)

    async def score(
        self, items: Iterable[Item], wait: float | None = None,
        job_timeout: float | None = INLINE_JOB_TIMEOUT,
    ) -> list[Result]:  # fmt: skip
        return await self._inline("score", items, None, wait, job_timeout)

    async def extract(
        self, items: Iterable[Item], wait: float | None = None,
        job_timeout: float | None = INLINE_JOB_TIMEOUT,
    ) -> list[Result]:  # fmt: skip
        return await self._inline("extract", items, None, wait, job_timeout)

    async def embed(
        self, items: Iterable[Item], wait: float | None = None,
        job_timeout: float | None = INLINE_JOB_TIMEOUT,
    ) -> list[Result]:  # fmt: skip
        return await self._inline("embed", items, None, wait, job_timeout)

    async def _inline(
        self,
        task: str,
        items: Iterable[Item],
        labels: Sequence[str] | None,
        wait: float | None,
        job_timeout: float | None,
    ) -> list[Result]:
        call = self._inline_call(task, items, labels, wait)
        response = await self.request(call.method, call.path, **call.kwargs)
        if response.status_code == 202:
            job_id = response.json()["id"]
            await self.wait(job_id, timeout=job_timeout)
            return [r async for r in self.results(job_id)]
        return inline_results(response.json())

    async def embeddings(
        self,
        input: str | Sequence[str],  # noqa: A002 - OpenAI's name for it
        model: str = "minilm",
        encoding_format: str = "float",
    ) -> dict[str, Any]:
        return await self._do(self._embeddings_call(input, model, encoding_format))

    async def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if (await self.http.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
        raise unhealthy(timeout)
