"""The JSON API under /v1: submit jobs, poll them, stream their results."""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import uuid
from typing import Any

from flask import Blueprint, Response, abort, g, jsonify, request, url_for
from sqlalchemy.orm import Session

from core.config.settings import Settings
from core.obs import tracing
from db import idempotency
from db.accounts import list_keys
from db.models import IdempotencyKey, Job
from db.session import session_factory
from jobs.inputs import (
    InputError,
    ItemStream,
    check_fields,
    file_items,
    json_items,
    parse_json_body,
    parse_labels,
)
from jobs.lifecycle import JobStateError, LaneFull, cancel_job
from jobs.results import job_view
from jobs.submit import parse_tasks, submit_job
from webapp.admin import account_view
from webapp.auth import app_settings, check_account, require_account
from webapp.errors import error_response
from webapp.joblist import job_page
from webapp.jobviews import (
    RetryRefused,
    dead_letters,
    item_limits,
    own_job_or_404,
    results_download,
)
from webapp.jobviews import retry_job as send_back

log = logging.getLogger(__name__)
api = Blueprint("api", __name__, url_prefix="/v1")
# Every endpoint here needs an account; a view cannot forget it.
api.before_request(check_account)

SUBMISSION_FIELDS = ("items", "tasks", "task", "labels")
UPLOAD_FIELDS = ("file", "tasks", "task", "labels")


def _settings() -> Settings:
    return app_settings()


def _bad_request(message: str) -> Response:
    return error_response(400, "invalid_input", message)


def _parse_submission(settings: Settings) -> tuple[list[str], list[str] | None, ItemStream]:
    """The job's tasks, labels and items; a file's items are read later, as they are
    stored (Werkzeug has spooled a large upload to disk)."""
    limits = item_limits(settings, g.account.type)
    if request.mimetype == "multipart/form-data":
        check_fields([*request.form, *request.files], UPLOAD_FIELDS)
        upload = request.files.get("file")
        if upload is None or not upload.filename:
            raise InputError(
                "the multipart upload needs a 'file' field with a .csv or .jsonl file "
                "(optionally .gz)"
            )
        tasks = parse_tasks(request.form.get("tasks"), request.form.get("task"))
        labels_raw: Any = request.form.get("labels")
        items = file_items(upload.filename, upload.stream, limits)
    else:
        if not request.is_json:
            abort(
                415,
                description="send a JSON object (Content-Type: application/json) or a "
                "multipart/form-data upload with a 'file' field",
            )
        body = parse_json_body(request.get_data(), SUBMISSION_FIELDS)
        tasks = parse_tasks(body.get("tasks"), body.get("task"))
        labels_raw = body.get("labels")
        if "items" not in body:
            raise InputError("'items' is required")
        items = json_items(body["items"], limits)
    labels = parse_labels(labels_raw, default=None) if "classify" in tasks else None
    return tasks, labels, items


# Printable ASCII, as Stripe's and the IETF draft's keys are (a UUID fits).
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")


@api.post("/jobs")
@require_account
def create_job():  # noqa: ANN201
    """Store a job. With an `Idempotency-Key`, the same key and body sent again answer
    the job the first stored (200), and the key with another body is a 409."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return _store_job()
    if not IDEMPOTENCY_KEY.fullmatch(key):
        return _bad_request(
            "the Idempotency-Key header must be 1 to 255 printable ASCII characters, e.g. a UUID"
        )
    account_id, fingerprint = g.account.id, _body_sha256()
    with session_factory(_settings())() as session:
        held = idempotency.claim(session, account_id, key, fingerprint)
        if held is not None:
            return _replay(session, held, fingerprint)
        try:
            response = _store_job()
        except BaseException:
            _release_quietly(session, account_id, key)
            raise
        if response.status_code == 202:
            idempotency.bind(session, account_id, key, uuid.UUID(response.json["id"]))
        else:
            idempotency.release(session, account_id, key)
        return response


def _release_quietly(session: Session, account_id: int, key: str) -> None:
    """Free the key of a submission that raised; the submission's error is the one to
    answer (a database that is away fails this too; the key then expires)."""
    try:
        session.rollback()
        idempotency.release(session, account_id, key)
    except Exception:  # noqa: BLE001
        log.warning("could not free an idempotency key after a failed submission")


def _body_sha256() -> str:
    """The request body's SHA-256: the raw bytes for JSON; for an upload, its form fields
    and file (a multipart boundary differs between two sendings of one request)."""
    digest = hashlib.sha256()
    if request.mimetype != "multipart/form-data":
        digest.update(request.get_data())
        return digest.hexdigest()
    for name, value in sorted(request.form.items(multi=True)):
        digest.update(f"{len(name)}:{name}={len(value)}:{value};".encode())
    for name, upload in sorted(request.files.items(multi=True), key=lambda f: f[0]):
        digest.update(f"{len(name)}:{name}:{upload.filename};".encode())
        for block in iter(functools.partial(upload.stream.read, 1 << 20), b""):
            digest.update(block)
        upload.stream.seek(0)
    return digest.hexdigest()


def _replay(session: Session, held: IdempotencyKey, fingerprint: str) -> Response:
    """The answer to a key already used: its job (200), or a 409 naming the problem."""
    if held.body_sha256 != fingerprint:
        return _conflict(
            "this Idempotency-Key was used with a different request body; "
            "use a new key for a new job"
        )
    job = session.get(Job, held.job_id) if held.job_id is not None else None
    if job is None:
        return _conflict(
            "a request with this Idempotency-Key is still being stored; send it again in a moment"
        )
    response = job_created(job)
    response.status_code = 200
    response.headers["Idempotent-Replayed"] = "true"
    return response


def _store_job() -> Response:
    settings = _settings()
    source = "upload" if request.mimetype == "multipart/form-data" else "api"
    try:
        tasks, labels, items = _parse_submission(settings)
        job = submit_job(
            g.account, items, tasks=tasks, labels=labels, source=source, settings=settings
        )
    except InputError as exc:
        return _bad_request(str(exc))
    except LaneFull as exc:
        return lane_full(exc)
    return job_created(job)


@api.get("/jobs")
@require_account
def list_jobs():  # noqa: ANN201
    """The caller's jobs, newest first: `limit` (1-100), `cursor` (the last page's
    `next_cursor`), `status` (comma-separated)."""
    try:
        page = job_page(
            _settings(),
            g.account.id,
            request.args,
            lambda job_id: url_for("api.get_job", job_id=job_id),
        )
    except InputError as exc:
        return _bad_request(str(exc))
    return jsonify(page)


def lane_full(exc: LaneFull) -> Response:
    """503 with Retry-After: the lane and its waiting room are full; nothing was stored."""
    response = error_response(503, "lane_full", str(exc))
    response.headers["Retry-After"] = str(exc.retry_after)
    return response


def job_created(job: Job) -> Response:
    """202, the stored job's id, status, lane and links, and its URL in Location."""
    body = {"id": str(job.id), "status": job.status, "lane": job.lane, "links": _links(job.id)}
    tracing.set_attributes(job=job.id, lane=job.lane)
    response = jsonify(body)
    response.status_code = 202
    response.headers["Location"] = url_for("api.get_job", job_id=job.id)
    return response


def _links(job_id: uuid.UUID) -> dict[str, str]:
    return {
        "self": url_for("api.get_job", job_id=job_id),
        "results": url_for("api.job_results", job_id=job_id),
        "results_csv": url_for("api.job_results", job_id=job_id, format="csv"),
        "dead_letters": url_for("api.job_dead_letters", job_id=job_id),
        "retry": url_for("api.retry_job", job_id=job_id),
    }


def _own_job(session: Session, job_id: str) -> Job:
    return own_job_or_404(session, job_id)


@api.get("/account")
def get_account() -> Response:
    """The caller's account: its type, limits and keys (prefixes only)."""
    settings = _settings()
    with session_factory(settings)() as session:
        view = account_view(g.account, settings, list_keys(session, g.account.id))
    return jsonify({**view, "key_prefix": g.key_prefix})


@api.get("/jobs/<job_id>")
@require_account
def get_job(job_id: str):  # noqa: ANN201
    with session_factory(_settings())() as session:
        job = _own_job(session, job_id)
        return jsonify({**job_view(session, job, _settings()), "links": _links(job.id)})


def _conflict(message: str) -> Response:
    return error_response(409, "conflict", message)


def _own_job_id(job_id: str) -> uuid.UUID:
    """The caller's job id, or 404, read in a session of its own."""
    with session_factory(_settings())() as session:
        return _own_job(session, job_id).id


def _view(job_id: uuid.UUID) -> dict[str, Any]:
    with session_factory(_settings())() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return {**job_view(session, job, _settings()), "links": _links(job.id)}


@api.delete("/jobs/<job_id>")
@require_account
def cancel(job_id: str):  # noqa: ANN201
    """Cancel: chunks not started are skipped, running ones stop at their next micro-batch."""
    key = _own_job_id(job_id)
    try:
        cancel_job(key, _settings())
    except JobStateError as exc:
        return _conflict(str(exc))
    return jsonify(_view(key)), 202


@api.get("/jobs/<job_id>/dead-letters")
@require_account
def job_dead_letters(job_id: str):  # noqa: ANN201
    with session_factory(_settings())() as session:
        return jsonify(dead_letters=dead_letters(session, _own_job(session, job_id).id))


@api.post("/jobs/<job_id>/retry")
@require_account
def retry_job(job_id: str):  # noqa: ANN201
    """Send the job's open dead letters back: their items run again as new chunks."""
    key = _own_job_id(job_id)
    try:
        letters, items = send_back(_settings(), key)
    except RetryRefused as exc:
        return _conflict(str(exc))
    body = {"retried_letters": letters, "retried_items": items, "job": _view(key)}
    return jsonify(body), 202


@api.get("/jobs/<job_id>/results")
@require_account
def job_results(job_id: str):  # noqa: ANN201
    return results_download(_settings(), job_id, request.args.get("format", "jsonl"))
