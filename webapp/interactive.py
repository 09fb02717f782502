"""Interactive endpoints: small requests answered inline, and an asynchronous pair.

`POST /v1/classify` (score, extract, embed): up to LANEWAY_SYNC_MAX_ITEMS items, answered
inline by the interactive workers (core/store/interactive_protocol.py). An answer not back within
LANEWAY_SYNC_TIMEOUT seconds (or `Prefer: wait=N`) turns the request into a normal job in
Postgres: `202` with the job's links, nothing lost. `POST /v1/inference` answers at once
with a `task_id`; `GET /v1/result/<task_id>` says PENDING, SUCCESS or FAILURE (another
account's id is a 404, as a job's).
"""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, Response, abort, g, jsonify, request, url_for

from core.config.settings import Settings
from core.store import interactive_protocol as ia
from core.store.cache import ResultCache
from core.vocab import TASKS
from jobs.inputs import InputError, Limits, json_items, parse_json_body, parse_labels
from jobs.lifecycle import LaneFull
from jobs.submit import parse_tasks, resolve_labels, submit_job
from webapp import interactive_client as ic
from webapp import ratelimit_gate
from webapp.api import job_created, lane_full
from webapp.auth import app_settings, check_account
from webapp.errors import error_response
from webapp.responses import json_response

interactive = Blueprint("interactive", __name__, url_prefix="/v1")
interactive.before_request(check_account)

SYNC_FIELDS = ("items", "labels")
ASYNC_FIELDS = ("items", "labels", "task", "tasks")


def _parse(settings: Settings, fields: tuple[str, ...], tasks: list[str] | None):
    """Tasks, labels and (id, text) items of a small request; InputError when bad."""
    if not request.is_json:
        abort(415, description="send a JSON object (Content-Type: application/json)")
    return parse_sync(settings, g.account.type, request.get_data(), fields, tasks)


def parse_sync(
    settings: Settings,
    account_type: str,
    data: bytes,
    fields: tuple[str, ...],
    tasks: list[str] | None,
) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """Tasks, labels and (id, text) items of a small request's JSON body; InputError when
    bad (the web app's fast path parses with it too: webapp/fastpath.py)."""
    body = parse_json_body(data, fields)
    if tasks is None:
        tasks = parse_tasks(body.get("tasks"), body.get("task"))
    if "items" not in body:
        raise InputError("'items' is required")
    raw = body["items"]
    limit = min(settings.sync_max_items, settings.limits_for(account_type).max_items)
    if isinstance(raw, list) and len(raw) > limit:
        raise InputError(
            f"'items' has {len(raw)} items; a synchronous request takes at most {limit} "
            "(LANEWAY_SYNC_MAX_ITEMS): submit more as a job, POST /v1/jobs"
        )
    limits = Limits(limit, settings.max_text_chars, "LANEWAY_SYNC_MAX_ITEMS")
    items: list[tuple[str, str]] = []
    seen: set[str] = set()
    stream = json_items(raw, limits)
    for item_id, text, place in stream.rows:
        if item_id in seen:
            raise InputError(f"{stream.at(place)}: duplicate id {item_id!r}")
        seen.add(item_id)
        items.append((item_id, text))
    if not items:
        raise InputError("the request has no items")
    # Checked whatever the task, so a malformed field is never silently ignored.
    given = parse_labels(body.get("labels"), default=None)
    return tasks, resolve_labels(settings, tasks, given), items


def _wait(settings: Settings) -> float:
    """How long to wait for an answer: `Prefer: wait=N`, within LANEWAY_SYNC_MAX_WAIT."""
    preferred = ic.parse_prefer_wait(request.headers.get("Prefer"))
    if preferred is None:
        return settings.sync_timeout
    return min(preferred, settings.sync_max_wait)


def _applied(response: Response, wait: float) -> Response:
    if ic.parse_prefer_wait(request.headers.get("Prefer")) is not None:
        response.headers["Preference-Applied"] = f"wait={int(wait)}"
    return response


def _as_job(settings: Settings, tasks: list[str], labels: list[str], items) -> Response:
    """No answer in time: the request becomes a job in Postgres, answered 202 (counted
    against the rate limit first if it has not been)."""
    ratelimit_gate.count_pending()
    try:
        job = submit_job(
            g.account, items, tasks=tasks, labels=labels or None, source="api", settings=settings
        )
    except LaneFull as exc:
        return lane_full(exc)
    return job_created(job)


def cached_results(
    settings: Settings, tasks, labels, items, account_id: int | None = None
) -> list[dict[str, Any]] | None:
    """Every item's output from the result cache (the caller's account's, or
    `account_id`'s), or None (then the worker computes)."""
    account = g.account.id if account_id is None else account_id
    cache = ResultCache(ic.blocking_client(settings), settings).scoped(account)
    outputs = cache.get(tasks, labels, [t for _, t in items])
    if any(o is None for o in outputs):
        return None
    return ia.item_results([i for i, _ in items], outputs, [None] * len(items))


def _sync(task: str) -> Response:
    settings = app_settings()
    try:
        tasks, labels, items = _parse(settings, SYNC_FIELDS, [task])
    except InputError as exc:
        return error_response(400, "invalid_input", str(exc))
    wait = _wait(settings)
    if ratelimit_gate.SENT in request.environ:
        # The fast path queued it and counted it: no answer came in time, or a failure.
        failed = request.environ[ratelimit_gate.SENT]
        ratelimit_gate.show_counted()
        if failed is None:
            return _as_job(settings, tasks, labels, items)
        return error_response(503, "inference_failed", failed.get("error", "failed"))
    started = time.perf_counter()
    results = cached_results(settings, tasks, labels, items)
    cached = results is not None
    if results is None and wait <= 0:
        return _applied(_as_job(settings, tasks, labels, items), wait)
    lane = None
    if results is None:
        req = ia.new_request(tasks, labels, items, keep=False, account=g.account.id)
        lane = ic.lane_for(settings)
        sent = time.perf_counter()
        body = ic.send_and_wait(settings, req, lane, wait)
        waited = time.perf_counter() - sent
        if body is None:
            ic.missed(settings, lane)
            return _applied(_as_job(settings, tasks, labels, items), wait)
        results = body["output"] or []
        if body["status"] == ia.FAILURE and not results:
            return error_response(503, "inference_failed", body.get("error", "failed"))
    total = time.perf_counter() - started
    response = json_response(
        {"task": task, "results": results, "cached": cached, "lane": lane,
         "seconds": round(total, 4)}
    )  # fmt: skip
    if not cached:
        response.headers["Server-Timing"] = ia.server_timing(body, waited, total)
    return _applied(response, wait)


def _sync_view(task: str):  # noqa: ANN202
    @ratelimit_gate.gated
    def view() -> Response:
        return _sync(task)

    view.__name__ = f"sync_{task}"
    return view


for _task in TASKS:
    interactive.add_url_rule(f"/{_task}", view_func=_sync_view(_task), methods=["POST"])


@interactive.post("/inference")
def submit_inference() -> Response:
    settings = app_settings()
    try:
        tasks, labels, items = _parse(settings, ASYNC_FIELDS, None)
    except InputError as exc:
        return error_response(400, "invalid_input", str(exc))
    req = ia.new_request(tasks, labels, items, keep=True, account=g.account.id)
    r = ic.blocking_client(settings)
    r.set(ia.owner_key(req.id), str(g.account.id), ex=ia.RESULT_TTL)
    ic.send(settings, [req], ic.lane_for(settings))
    link = url_for("interactive.get_result", task_id=req.id)
    response = jsonify(task_id=req.id, status=ia.PENDING, links={"result": link})
    response.status_code = 202
    response.headers["Location"] = link
    return response


@interactive.get("/result/<task_id>")
def get_result(task_id: str) -> Response:
    settings = app_settings()
    r = ic.blocking_client(settings)
    owner = r.get(ia.owner_key(task_id)) if len(task_id) == 32 else None
    if owner is None or owner.decode() != str(g.account.id):
        abort(404, description=f"no task {task_id!r}")
    body = ia.read_result(r, task_id)
    wait = 0.0
    if body is None:
        preferred = ic.parse_prefer_wait(request.headers.get("Prefer"))
        wait = min(preferred or 0.0, settings.sync_max_wait)
        if wait > 0 and ia.wait_answer(r, task_id, wait) is not None:
            body = ia.read_result(r, task_id)
    if body is None:
        body = {"status": ia.PENDING, "output": None}
    return _applied(jsonify(task_id=task_id, **body), wait)
