"""Operations endpoints: liveness and health, the lanes' depth (for autoscalers such as
KEDA), and the OpenAPI document of the whole HTTP interface."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import redis
import yaml
from flask import Blueprint, Response, abort, current_app, jsonify
from sqlalchemy import text

from core.queueing.broker import queue_depths
from core.store.redis_conn import ping
from db.session import session_factory

ops = Blueprint("ops", __name__)


@ops.get("/livez")
def livez():  # noqa: ANN201
    """200 while this process answers requests. It asks nothing of the database or Redis:
    a liveness probe on /healthz would restart every web process during their outage,
    which a restart cannot mend (/healthz is for readiness)."""
    return jsonify(status="alive")


@ops.get("/healthz")
def healthz():  # noqa: ANN201
    """200 when the database and Redis both answer, else 503 naming what failed."""
    settings = current_app.config["LANEWAY_SETTINGS"]
    checks = {}
    try:
        with session_factory(settings)() as session:
            session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
        checks["database"] = f"error: {type(exc).__name__}"
    checks["redis"] = "ok" if ping(settings) else "error: no answer"
    healthy = all(v == "ok" for v in checks.values())
    return jsonify(status="ok" if healthy else "unavailable", **checks), 200 if healthy else 503


@ops.get("/lanes")
def lanes():  # noqa: ANN201
    """Each queue's depth: messages queued, delivered to workers (reserved or running: the
    part a bare list length misses), and both together. Counts only, no job data."""
    settings = current_app.config["LANEWAY_SETTINGS"]
    try:
        return jsonify(queue_depths(settings))
    except Exception as exc:  # noqa: BLE001 - an autoscaler must see "unknown", not a 500
        return jsonify(error="unavailable", message=f"broker: {type(exc).__name__}"), 503


@ops.get("/metrics")
def metrics() -> Response:
    """Prometheus: every Laneway process's metrics on this machine and the queues' depth.
    Fleet-wide figures only, no account's data, so no key is asked (LANEWAY_METRICS=off
    turns it off; bind or firewall it as any scrape target)."""
    settings = current_app.config["LANEWAY_SETTINGS"]
    if not settings.metrics:
        abort(404, description="metrics are off (LANEWAY_METRICS=off)")
    from prometheus_client import CONTENT_TYPE_LATEST

    from webapp.metrics import exposition

    try:
        body = exposition(settings)
    except redis.RedisError as exc:
        return jsonify(error="unavailable", message=f"Redis: {type(exc).__name__}"), 503
    return Response(body, content_type=CONTENT_TYPE_LATEST)


OPENAPI_SPEC = Path(__file__).parent / "openapi.yaml"


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    """The maintained spec (webapp/openapi.yaml), read once."""
    return yaml.safe_load(OPENAPI_SPEC.read_text())


@ops.get("/openapi.json")
def openapi_json() -> Response:
    return jsonify(openapi_document())
