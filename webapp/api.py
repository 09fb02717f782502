"""The JSON API under /v1: submit jobs, poll them, stream their results."""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, abort, current_app, g, jsonify, request, url_for
from sqlalchemy.orm import Session

from db.models import FINAL_JOB_STATUSES, Job
from db.queries import aware, items_done, iter_results, job_cost
from db.session import session_factory
from laneway.inputs import InputError, Limits, parse_file, parse_json_items, parse_labels
from laneway.jobs import parse_tasks, submit_job
from laneway.settings import Settings
from webapp.auth import require_account

api = Blueprint("api", __name__, url_prefix="/v1")


def _settings() -> Settings:
    return current_app.config["LANEWAY_SETTINGS"]


def _bad_request(message: str) -> Response:
    response = jsonify(error="invalid_input", message=message)
    response.status_code = 400
    return response


def _parse_submission(
    settings: Settings,
) -> tuple[list[str], list[str] | None, list[tuple[str, str]]]:
    limits = Limits(settings.max_items, settings.max_text_chars)
    if request.mimetype == "multipart/form-data":
        upload = request.files.get("file")
        if upload is None or not upload.filename:
            raise InputError("the multipart upload needs a 'file' field with a .csv or .jsonl file")
        tasks = parse_tasks(request.form.get("tasks"), request.form.get("task"))
        labels_raw: Any = request.form.get("labels")
        items = parse_file(upload.filename, upload.stream, limits)
    else:
        try:
            body = request.get_json(silent=True)
        except RecursionError:
            body = None
        if not isinstance(body, dict):
            raise InputError("send a JSON object body (Content-Type: application/json) or a file")
        tasks = parse_tasks(body.get("tasks"), body.get("task"))
        labels_raw = body.get("labels")
        if "items" not in body:
            raise InputError("'items' is required")
        items = parse_json_items(body["items"], limits)
    labels = parse_labels(labels_raw, default=None) if "classify" in tasks else None
    return tasks, labels, items


@api.post("/jobs")
@require_account
def create_job():  # noqa: ANN201
    settings = _settings()
    source = "upload" if request.mimetype == "multipart/form-data" else "api"
    try:
        tasks, labels, items = _parse_submission(settings)
        job = submit_job(
            g.account, items, tasks=tasks, labels=labels, source=source, settings=settings
        )
    except InputError as exc:
        return _bad_request(str(exc))
    body = {"id": str(job.id), "status": job.status, "lane": job.lane, "links": _links(job.id)}
    return jsonify(body), 202, {"Location": url_for("api.get_job", job_id=job.id)}


def _links(job_id: uuid.UUID) -> dict[str, str]:
    return {
        "self": url_for("api.get_job", job_id=job_id),
        "results": url_for("api.job_results", job_id=job_id),
        "results_csv": url_for("api.job_results", job_id=job_id, format="csv"),
    }


def _own_job(session: Session, job_id: str) -> Job:
    """The caller's job, or 404 (another account's job is indistinguishable from none)."""
    try:
        key = uuid.UUID(job_id)
    except ValueError:
        abort(404, description=f"no job {job_id!r}")
    job = session.get(Job, key)
    if job is None or job.account_id != g.account.id:
        abort(404, description=f"no job {job_id!r}")
    return job


def _seconds(a, b) -> float | None:  # noqa: ANN001
    if a is None or b is None:
        return None
    return round((aware(b) - aware(a)).total_seconds(), 3)


def _iso(moment) -> str | None:  # noqa: ANN001
    return aware(moment).isoformat() if moment is not None else None


def job_view(session: Session, job: Job, settings: Settings) -> dict[str, Any]:
    final = job.status in FINAL_JOB_STATUSES
    done = job.succeeded_items + job.failed_items if final else items_done(session, job.id)
    total = job.total_items
    return {
        "id": str(job.id),
        "status": job.status,
        "lane": job.lane,
        "tasks": job.tasks,
        "labels": job.labels,
        "source": job.source,
        "progress": {
            "done": done,
            "total": total,
            "percent": round(100.0 * done / total, 1) if total else 100.0,
        },
        "counts": {"succeeded": job.succeeded_items, "failed": job.failed_items} if final else None,
        "label_counts": job.label_counts,
        "timings": {
            "created_at": _iso(job.created_at),
            "started_at": _iso(job.started_at),
            "finished_at": _iso(job.finished_at),
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
        "cost": job.cost
        if final
        else job_cost(session, job.id, total, settings.cpu_price, settings.gpu_price),
        "links": _links(job.id),
    }


@api.get("/jobs/<job_id>")
@require_account
def get_job(job_id: str):  # noqa: ANN201
    with session_factory(_settings())() as session:
        return jsonify(job_view(session, _own_job(session, job_id), _settings()))


def result_record(result: Any) -> dict[str, Any]:
    if result.error is not None:
        return {"id": result.item_id, "error": result.error}
    out = result.output or {}
    return {"id": result.item_id, **out}


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
        return row

    return header, cells


@api.get("/jobs/<job_id>/results")
@require_account
def job_results(job_id: str):  # noqa: ANN201
    fmt = request.args.get("format", "jsonl")
    if fmt not in ("jsonl", "csv"):
        abort(400, description=f"unknown format {fmt!r}; use jsonl or csv")
    factory = session_factory(_settings())
    with factory() as session:
        job = _own_job(session, job_id)
        key, tasks, labels = job.id, list(job.tasks), list(job.labels)

    def jsonl() -> Iterator[str]:
        with factory() as session:
            for result in iter_results(session, key):
                yield json.dumps(result_record(result), ensure_ascii=False) + "\n"

    def csv_rows() -> Iterator[str]:
        header, cells = csv_layout(tasks, labels)
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(header)
        with factory() as session:
            for n, result in enumerate(iter_results(session, key)):
                writer.writerow(cells(result))
                if n % 500 == 0:
                    yield buf.getvalue()
                    buf.seek(0)
                    buf.truncate()
        yield buf.getvalue()

    if fmt == "csv":
        return Response(
            csv_rows(),
            mimetype="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{key}-results.csv"'},
        )
    return Response(
        jsonl(),
        mimetype="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="{key}-results.jsonl"'},
    )
