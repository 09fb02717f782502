"""The Flask application factory: JSON API, ops endpoints."""

from __future__ import annotations

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from laneway.settings import Settings, get_settings


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or get_settings()
    app = Flask(__name__)
    app.config["LANEWAY_SETTINGS"] = settings
    app.config["MAX_CONTENT_LENGTH"] = settings.max_upload_bytes
    app.json.sort_keys = False

    from webapp.api import api
    from webapp.ops import ops

    app.register_blueprint(api)
    app.register_blueprint(ops)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):  # noqa: ANN202
        # Every error is JSON with a message naming the problem; never an HTML page.
        body = {"error": exc.name.lower().replace(" ", "_"), "message": exc.description}
        response = jsonify(body)
        response.status_code = exc.code or 500
        if exc.code == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        if exc.code == 405 and request.url_rule is None:
            response.headers["Allow"] = ", ".join(exc.valid_methods or [])  # type: ignore[attr-defined]
        return response

    return app
