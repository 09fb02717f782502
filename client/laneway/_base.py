"""What the sync and async clients share: settings, request building and answer parsing.

Each API call is a `Call` (method, path, httpx keyword arguments, and how its JSON answer
becomes a typed value); `Client` and `AsyncClient` only send it, the one blocking and the
other awaiting, through the same retry rules (`retry.Attempts`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from laneway.errors import LanewayError
from laneway.types import Job, JobList, Result

Item = str | tuple[str, str] | dict[str, Any]
DEFAULT_URL = "http://127.0.0.1:8000"  # `laneway up`'s address (LANEWAY_WEB_HOST/PORT)
# How long an inline request that became a job (202) is waited for, by default.
INLINE_JOB_TIMEOUT = 300.0


def _identity(body: Any) -> Any:
    return body


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    parse: Callable[[Any], Any] = _identity


def connection(base_url: str | None, api_key: str | None) -> tuple[str, str]:
    """The URL and key given, else LANEWAY_URL and LANEWAY_API_KEY (the URL defaulting to
    a local `laneway up`)."""
    url = base_url or os.environ.get("LANEWAY_URL") or DEFAULT_URL
    key = api_key or os.environ.get("LANEWAY_API_KEY")
    if not key:
        raise LanewayError(0, "missing_api_key", "no API key: pass api_key= or set LANEWAY_API_KEY")
    return url.rstrip("/"), key


def http_options(base_url: str | None, api_key: str | None, timeout: float) -> dict[str, Any]:
    url, key = connection(base_url, api_key)
    return {
        "base_url": url,
        "headers": {"Authorization": f"Bearer {key}"},
        "timeout": timeout,
    }


class Calls:
    """Every API call as a `Call`; the clients' methods of the same names send them."""

    def _submit_call(
        self,
        items: Iterable[Item],
        tasks: str | Sequence[str],
        labels: Sequence[str] | None,
        idempotency_key: str | None,
    ) -> Call:
        body: dict[str, Any] = {"items": items_body(items), "tasks": tasks_text(tasks)}
        if labels is not None:
            body["labels"] = list(labels)
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        return Call("POST", "/v1/jobs", {"json": body, "headers": headers}, Job.parse)

    def _job_call(self, job_id: str) -> Call:
        return Call("GET", f"/v1/jobs/{job_id}", parse=Job.parse)

    def _jobs_call(
        self, status: str | Sequence[str] | None, limit: int, cursor: str | None
    ) -> Call:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status if isinstance(status, str) else ",".join(status)
        if cursor:
            params["cursor"] = cursor
        return Call("GET", "/v1/jobs", {"params": params}, JobList.parse)

    def _cancel_call(self, job_id: str) -> Call:
        return Call("DELETE", f"/v1/jobs/{job_id}", parse=Job.parse)

    def _dead_letters_call(self, job_id: str) -> Call:
        return Call("GET", f"/v1/jobs/{job_id}/dead-letters")

    def _retry_call(self, job_id: str) -> Call:
        return Call("POST", f"/v1/jobs/{job_id}/retry")

    def _account_call(self) -> Call:
        return Call("GET", "/v1/account")

    def _inline_call(
        self, task: str, items: Iterable[Item], labels: Sequence[str] | None, wait: float | None
    ) -> Call:
        body: dict[str, Any] = {"items": items_body(items)}
        if labels is not None:
            body["labels"] = list(labels)
        headers = {} if wait is None else {"Prefer": f"wait={max(0, int(wait))}"}
        return Call("POST", f"/v1/{task}", {"json": body, "headers": headers})

    def _embeddings_call(
        self,
        input: str | Sequence[str],
        model: str,
        encoding_format: str,  # noqa: A002
    ) -> Call:
        body = {"input": input, "model": model, "encoding_format": encoding_format}
        return Call("POST", "/v1/embeddings", {"json": body})


def upload_fields(tasks: str | Sequence[str], labels: str | Sequence[str] | None) -> dict[str, str]:
    data = {"tasks": tasks_text(tasks)}
    if labels:
        data["labels"] = labels if isinstance(labels, str) else ",".join(labels)
    return data


def inline_results(body: dict[str, Any]) -> list[Result]:
    return [Result.parse(r) for r in body["results"]]


def tasks_text(tasks: str | Sequence[str]) -> str:
    return tasks if isinstance(tasks, str) else ",".join(tasks)


def items_body(items: Iterable[Item]) -> list[dict[str, Any]]:
    """{"id", "text"} objects from texts (their places are their ids), (id, text) pairs
    or such objects."""
    out = []
    for n, item in enumerate(items):
        if isinstance(item, str):
            out.append({"id": str(n), "text": item})
        elif isinstance(item, tuple):
            out.append({"id": item[0], "text": item[1]})
        else:
            out.append(item)
    return out


class Counted:
    """A file whose reads report the bytes sent so far (httpx reads it in 64 KiB pieces)."""

    def __init__(
        self, fh: IO[bytes], total: int, progress: Callable[[int, int], None] | None
    ) -> None:
        self.fh, self.total, self.progress, self.sent = fh, total, progress, 0

    @classmethod
    def open(cls, path: Path, progress: Callable[[int, int], None] | None) -> Counted:
        """Only a regular file: a device or a pipe has no size to declare (its reads would
        overrun the Content-Length) and no start to rewind to for a retry. A path that is
        not there is open()'s FileNotFoundError, as for any file."""
        if path.exists() and not path.is_file():
            what = "a folder" if path.is_dir() else "a device, a pipe or a socket"
            raise ValueError(f"{path} is not a regular file ({what})")
        return cls(path.open("rb"), path.stat().st_size, progress)

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


class Upload:
    """A file upload's request, built afresh for each attempt: a retried upload starts from
    its first byte. `close()` closes what the attempts opened."""

    def __init__(
        self,
        http: httpx.Client | httpx.AsyncClient,
        path: str | Path,
        tasks: str | Sequence[str],
        labels: str | Sequence[str] | None,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.http, self.path, self.progress = http, Path(path), progress
        self.data = upload_fields(tasks, labels)
        self.opened: list[Counted] = []

    def build(self) -> httpx.Request:
        self.close()
        self.opened.append(Counted.open(self.path, self.progress))
        files = {"file": (self.path.name, self.opened[-1])}
        return self.http.build_request("POST", "/v1/jobs", files=files, data=self.data)

    def close(self) -> None:
        for fh in self.opened:
            fh.close()


def job_timed_out(job: Job, timeout: float | None) -> TimeoutError:
    return TimeoutError(f"job {job.id} still {job.status} after {timeout} s")


def unhealthy(timeout: float) -> LanewayError:
    return LanewayError(0, "unhealthy", f"the web app was not healthy within {timeout:.0f} s")


TRANSPORT_ERRORS = httpx.TransportError
