"""Operations endpoints: health."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify
from sqlalchemy import text

from db.session import session_factory
from laneway.redis_conn import ping

ops = Blueprint("ops", __name__)


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
