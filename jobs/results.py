"""How a job and its results are shown: the API's answers and the outbox's files share it."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy.orm import Session

from core.config.settings import Settings
from core.util import vectors
from db.common import aware
from db.models import FINAL_JOB_STATUSES, Job
from db.results import items_done, job_cost, job_runtimes
from jobs.exports import spreadsheet_safe
from jobs.fairshare import job_place


def _seconds(a, b) -> float | None:  # noqa: ANN001
    if a is None or b is None:
        return None
    return round((aware(b) - aware(a)).total_seconds(), 3)


def iso(moment) -> str | None:  # noqa: ANN001
    return aware(moment).isoformat() if moment is not None else None


def job_view(session: Session, job: Job, settings: Settings, place: bool = True) -> dict[str, Any]:
    """Status, progress, counts, label counts, timings, stage seconds, the precision and
    runtimes its chunks ran with, cost, and (with `place`) its place on its lane while
    chunks of it wait for a slot. A listing leaves the place out (None): it reads the
    whole lane, once per job."""
    final = job.status in FINAL_JOB_STATUSES
    done = job.succeeded_items + job.failed_items if final else items_done(session, job.id)
    total = job.total_items
    runtimes = job_runtimes(session, job.id)
    precisions = {r["precision"] for r in runtimes}
    return {
        "id": str(job.id),
        "status": job.status,
        "lane": job.lane,
        "routing": job.routing,
        "tasks": job.tasks,
        "labels": job.labels,
        "source": job.source,
        "progress": {
            "done": done,
            "total": total,
            "percent": round(100.0 * done / total, 1) if total else 100.0,
        },
        "counts": {
            "succeeded": job.succeeded_items,
            "failed": job.failed_items,
            "cancelled": job.cancelled_items,
        }
        if final
        else None,
        "label_counts": job.label_counts,
        "timings": {
            "created_at": iso(job.created_at),
            "started_at": iso(job.started_at),
            "finished_at": iso(job.finished_at),
            "queued_seconds": _seconds(job.created_at, job.started_at),
            "run_seconds": _seconds(job.started_at, job.finished_at),
        },
        "stage_seconds": {
            "pre": round(job.pre_seconds, 3),
            "model": round(job.model_seconds, 3),
            "post": round(job.post_seconds, 3),
        }
        if final
        else None,
        # What the chunks' model stage ran with: one precision, "mixed", or None before
        # any chunk ran a model.
        "precision": precisions.pop() if len(precisions) == 1 else "mixed" if precisions else None,
        "runtimes": runtimes,
        "cost": job.cost
        if final
        else job_cost(session, job.id, total, settings.cpu_price, settings.gpu_price),
        "queue": job_place(session, settings, job) if place and not final else None,
    }


def result_record(result: Any) -> dict[str, Any]:
    if result.error is not None:
        return {"id": result.item_id, "error": result.error}
    return {"id": result.item_id, **vectors.join(result.output, result.vector)}


def csv_layout(tasks: list[str], labels: list[str]):  # noqa: ANN201
    """CSV columns for a job's tasks: scalar fields flat, entities as compact JSON; the
    embedding vector is left to JSONL."""
    header = ["id"]
    if "classify" in tasks:
        header += ["label", "score", *[f"score:{x}" for x in labels]]
    if "score" in tasks:
        header.append("rating")
    if "extract" in tasks:
        header.append("entities")
    header.append("error")

    def cells(result: Any) -> list[Any]:
        out = result.output or {}
        row: list[Any] = [result.item_id]
        if "classify" in tasks:
            scores = out.get("scores", {})
            row += [
                out.get("label", ""),
                out.get("score", ""),
                *[scores.get(x, "") for x in labels],
            ]
        if "score" in tasks:
            row.append(out.get("rating", ""))
        if "extract" in tasks:
            row.append(json.dumps(out["entities"], ensure_ascii=False) if "entities" in out else "")
        row.append(result.error or "")
        return [spreadsheet_safe(cell) for cell in row]

    return header, cells


def jsonl_lines(results: Iterable[Any]) -> Iterator[str]:
    """One JSON line per result."""
    for result in results:
        yield json.dumps(result_record(result), ensure_ascii=False) + "\n"


def csv_blocks(
    results: Iterable[Any], tasks: list[str], labels: list[str], every: int = 500
) -> Iterator[str]:
    """The header and the results as CSV text, a block of `every` rows at a time."""
    header, cells = csv_layout(tasks, labels)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    for n, result in enumerate(results):
        writer.writerow(cells(result))
        if n % every == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()
