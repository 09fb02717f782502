"""Typed answers: jobs, pages of jobs and results, as frozen dataclasses.

Each keeps the server's JSON in `raw`, and reads it by key too (`job["id"]`,
`record["label"]`), so code written against the dict answers of the 0.1 client keeps
working; attributes are the typed way in.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

FINAL = ("succeeded", "partial", "failed", "cancelled")


class _Raw:
    """Key access to the server's JSON, for callers of the dict-answering client."""

    raw: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.raw


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    percent: float


@dataclass(frozen=True)
class Job(_Raw):
    """A job as the server last described it. What a submission or a list answers is a
    summary: the fields it does not carry are None (`client.job(id)` has them all)."""

    id: str
    status: str
    lane: str
    links: dict[str, str] = field(default_factory=dict)
    tasks: list[str] | None = None
    labels: list[str] | None = None
    source: str | None = None
    progress: Progress | None = None
    counts: dict[str, int] | None = None
    label_counts: dict[str, int] | None = None
    timings: dict[str, Any] | None = None
    stage_seconds: dict[str, float] | None = None
    cost: dict[str, Any] | None = None
    total_items: int | None = None
    created_at: str | None = None
    finished_at: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ended(self) -> bool:
        return self.status in FINAL

    @classmethod
    def parse(cls, body: dict[str, Any]) -> Job:
        progress = body.get("progress")
        timings = body.get("timings") or {}
        total = body.get("total_items", progress["total"] if progress else None)
        return cls(
            id=body["id"],
            status=body["status"],
            lane=body["lane"],
            links=body.get("links") or {},
            tasks=body.get("tasks"),
            labels=body.get("labels"),
            source=body.get("source"),
            progress=Progress(**progress) if progress else None,
            counts=body.get("counts"),
            label_counts=body.get("label_counts"),
            timings=body.get("timings"),
            stage_seconds=body.get("stage_seconds"),
            cost=body.get("cost"),
            total_items=total,
            created_at=body.get("created_at", timings.get("created_at")),
            finished_at=body.get("finished_at", timings.get("finished_at")),
            raw=body,
        )


@dataclass(frozen=True)
class JobList(_Raw):
    """A page of the caller's jobs, newest first; `next_cursor` asks for the next page
    (None on the last). Iterating it gives its jobs."""

    data: list[Job]
    next_cursor: str | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __iter__(self) -> Iterator[Job]:  # type: ignore[override]
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    @classmethod
    def parse(cls, body: dict[str, Any]) -> JobList:
        return cls([Job.parse(j) for j in body["data"]], body.get("next_cursor"), body)


@dataclass(frozen=True)
class Result(_Raw):
    """One item's result: its id, and its tasks' fields (None where a task did not run),
    or `error` for an item the model failed on."""

    id: str
    label: str | None = None
    score: float | None = None
    scores: dict[str, float] | None = None
    rating: float | None = None
    entities: list[dict[str, Any]] | None = None
    embedding: list[float] | None = None
    tokens: int | None = None
    error: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, body: dict[str, Any]) -> Result:
        known = {k: body.get(k) for k in cls.__dataclass_fields__ if k not in ("id", "raw")}
        return cls(id=str(body["id"]), **known, raw=body)
