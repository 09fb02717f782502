"""The Flask application factory: JSON API, admin API, web pages, ops endpoints."""

from __future__ import annotations

from celery import Celery
from flask import Flask

from core.config.settings import Settings, get_settings
from core.obs import tracing
from core.obs.logsafe import install_redaction
from core.queueing.celery_app import make_celery
from webapp.admin import admin
from webapp.api import api
from webapp.errors import register_error_handlers
from webapp.fastpath import FastPath
from webapp.interactive import interactive
from webapp.openai_compat import openai
from webapp.ops import ops
from webapp.pages import pages
from webapp.request import LanewayRequest
from webapp.security import init_security


def celery_init_app(app: Flask, settings: Settings) -> Celery:
    """The Celery app this web app sends through, built from the same settings (Flask's
    `examples/celery` pattern). Its tasks run in workers, which need no Flask app context:
    the app is kept for sending, by task name, and never imports a task module."""
    celery = make_celery(settings)
    app.extensions["celery"] = celery
    return celery


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or get_settings()
    install_redaction()
    # gunicorn builds the app in each worker after its fork: traces start there too.
    tracing.configure("laneway-web")
    # webapp/static: the pages' stylesheet and script (the CSP allows only this origin).
    app = Flask(__name__)
    app.request_class = LanewayRequest  # a chunked body past the limit: 413, not cut off
    app.config["LANEWAY_SETTINGS"] = settings
    # The ceiling for every request; identify() lowers it to the caller's account type.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_upload_bytes
    app.json.sort_keys = False

    celery_init_app(app, settings)
    for blueprint in (api, admin, ops, pages, interactive, openai):
        app.register_blueprint(blueprint)
    app.extensions["laneway_limiter"] = init_security(app, settings)
    register_error_handlers(app)
    tracing.instrument_flask(app)
    # The plain synchronous request answered beneath Flask (webapp/fastpath.py).
    app.wsgi_app = FastPath(app)  # type: ignore[method-assign]
    return app
