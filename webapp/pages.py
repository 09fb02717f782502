"""Web pages: sign in with an API key (kept as a signed session), submit a job, the job
list, a job (live progress, then its results, failures and dead letters), the dashboard.

Every form carries a CSRF token (Flask-WTF), the session cookie is HttpOnly, SameSite=Lax
and Secure, pages are never cached. Everything about jobs is the signed-in account's only
(webapp/jobviews.py, shared with the JSON API); the dashboard shows fleet-wide figures.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlsplit

import redis
from flask import (
    Blueprint,
    Response,
    abort,
    g,
    jsonify,
    redirect,
    render_template,
    request,
    url_for,
)
from flask_wtf import FlaskForm
from flask_wtf.file import FileField
from wtforms import PasswordField, SelectMultipleField, StringField, TextAreaField
from wtforms.validators import DataRequired, Length
from wtforms.widgets import CheckboxInput, ListWidget

from core.queueing.broker import queue_depths
from core.store.redis_conn import redis_client
from core.vocab import TASKS
from db.accounts import live_key
from db.models import FINAL_JOB_STATUSES
from db.session import session_factory
from jobs.inputs import InputError, file_items, json_items, parse_labels
from jobs.lifecycle import LaneFull
from jobs.results import job_view, result_record
from jobs.submit import parse_tasks, submit_job
from webapp import charts, jobviews, sessions
from webapp.auth import app_settings

pages = Blueprint("pages", __name__)


class LoginForm(FlaskForm):
    api_key = PasswordField("API key", validators=[DataRequired(), Length(max=200)])


class LogoutForm(FlaskForm):
    """No fields: the CSRF token alone, so another site cannot sign a user out."""


class RetryForm(FlaskForm):
    """No fields: the CSRF token alone."""


class SubmitForm(FlaskForm):
    texts = TextAreaField("Texts, one per line")
    file = FileField("or a file: .csv (id,text) or .jsonl, optionally .gz")
    tasks = SelectMultipleField(
        "Tasks",
        choices=list(TASKS),
        default=["classify"],
        option_widget=CheckboxInput(),
        widget=ListWidget(prefix_label=False),
    )
    labels = StringField("Labels for classify, comma-separated (empty: the defaults)")


def signed_in(view: Callable[..., Any]) -> Callable[..., Any]:
    """Send a visitor who is not signed in to the sign-in form."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if g.get("account") is None:
            return redirect(url_for("pages.login"), code=303)
        return view(*args, **kwargs)

    return wrapper


@pages.context_processor
def _layout() -> dict[str, Any]:
    """The navigation's sign-out form, on every page of a signed-in account. It is only
    rendered, never filled from the request: reading a body that is too large would raise
    again inside the error page that answers it."""
    return {"logout": LogoutForm(formdata=None), "account": g.get("account")}


@pages.after_request
def _no_store(response: Response) -> Response:
    response.headers["Cache-Control"] = "no-store"
    return response


@pages.route("/login", methods=["GET", "POST"])
def login() -> Response | tuple[str, int] | str:
    form = LoginForm()
    if not form.validate_on_submit():
        return render_template("pages/login.html", form=form), 400 if form.errors else 200
    with session_factory(app_settings())() as db:
        row = live_key(db, form.api_key.data.strip())
        key_id = row.id if row is not None else None
    if key_id is None:
        form.api_key.errors = ["this API key is not valid (unknown, revoked or mistyped)"]
        return render_template("pages/login.html", form=form), 401
    # A fresh session: nothing from before the login survives it (no fixation).
    try:
        sessions.begin(app_settings(), key_id)
    except redis.RedisError:
        abort(503, description="signing in is unavailable for a moment (Redis is unreachable)")
    return redirect(url_for("pages.home"), code=303)


@pages.post("/logout")
def logout() -> Response | tuple[str, int]:
    form = LogoutForm()
    if not form.validate_on_submit():
        message = "sign out with the button on the page"
        return render_template("pages/error.html", code=400, message=message), 400
    sessions.end(app_settings())
    return redirect(url_for("pages.login"), code=303)


@pages.get("/")
@signed_in
def home() -> Response | str:
    limits = app_settings().limits_for(g.account.type)
    return render_template("pages/home.html", limits=limits, key_prefix=g.key_prefix)


# --- submit -------------------------------------------------------------------------------


def _form_items(form: SubmitForm, settings: Any):  # noqa: ANN202
    """The job's items from the upload (read as stored, the API's streaming path) or the
    pasted lines (ids are their line numbers)."""
    limits = jobviews.item_limits(settings, g.account.type)
    upload = form.file.data
    if upload is not None and upload.filename:
        if (form.texts.data or "").strip():
            raise InputError("paste texts or upload a file, not both")
        return file_items(upload.filename, upload.stream, limits)
    lines = [
        {"id": str(n), "text": line.strip()}
        for n, line in enumerate((form.texts.data or "").splitlines(), 1)
        if line.strip()
    ]
    if not lines:
        raise InputError("paste at least one text, or upload a .csv or .jsonl file")
    return json_items(lines, limits)


@pages.route("/submit", methods=["GET", "POST"])
@signed_in
def submit() -> Response | tuple[str, int] | str:
    form = SubmitForm()
    if not form.validate_on_submit():
        return render_template("pages/submit.html", form=form), 400 if form.errors else 200
    settings = app_settings()
    try:
        tasks = parse_tasks(form.tasks.data or [], None)
        labels = parse_labels(form.labels.data or None, None) if "classify" in tasks else None
        items = _form_items(form, settings)
        job = submit_job(
            g.account, items, tasks=tasks, labels=labels, source="web", settings=settings
        )
    except InputError as exc:
        return render_template("pages/submit.html", form=form, problem=str(exc)), 400
    except LaneFull as exc:
        html = render_template("pages/submit.html", form=form, problem=str(exc))
        return html, 503, {"Retry-After": str(exc.retry_after)}
    return redirect(url_for("pages.job", job_id=job.id), code=303)


# --- jobs ---------------------------------------------------------------------------------


@pages.get("/jobs")
@signed_in
def jobs() -> str:
    settings = app_settings()
    number = jobviews.page_number(request.args.get("page"))
    with session_factory(settings)() as db:
        listing = jobviews.list_jobs(db, g.account.id, number)
        views = [job_view(db, job, settings, place=False) for job in listing.rows]
    return render_template("pages/jobs.html", listing=listing, jobs=views)


@pages.get("/jobs/<job_id>")
@signed_in
def job(job_id: str) -> str:
    settings = app_settings()
    number = jobviews.page_number(request.args.get("page"))
    with session_factory(settings)() as db:
        row = jobviews.own_job_or_404(db, job_id)
        view = job_view(db, row, settings)
        final = row.status in FINAL_JOB_STATUSES
        results = jobviews.results_page(db, row, number) if final else None
        failed, failed_total = jobviews.failed_items(db, row.id) if final else ([], 0)
        letters = jobviews.dead_letters(db, row.id, limit=100)
        waiting = jobviews.open_letters(db, row.id)
        page = results.rows if results else []
        texts = jobviews.item_texts(db, row.id, [r.idx for r in (*page, *failed)])
    # Each result beside its item's text, shortened: a person judges the answers here.
    rows = [{**result_record(r), "text": texts.get(r.idx, "")} for r in page]
    return render_template(
        "pages/job.html",
        job=view,
        progress=jobviews.progress(view),
        results=results,
        rows=rows,
        failed=failed,
        texts=texts,
        failed_total=failed_total,
        letters=letters,
        open_letters=waiting,
        retry=RetryForm(),
    )


@pages.get("/jobs/<job_id>/progress")
def job_progress(job_id: str) -> Response | tuple[Response, int]:
    """The progress bar's figures, as JSON, for the job page's script."""
    if g.get("account") is None:
        return jsonify(error="unauthorized", message="sign in first"), 401
    settings = app_settings()
    with session_factory(settings)() as db:
        view = job_view(db, jobviews.own_job_or_404(db, job_id), settings)
    return jsonify(jobviews.progress(view))


@pages.get("/jobs/<job_id>/results")
@signed_in
def job_results(job_id: str) -> Response:
    return jobviews.results_download(
        app_settings(), job_id, request.args.get("format", "jsonl"), request.args.get("only")
    )


@pages.post("/jobs/<job_id>/retry")
@signed_in
def job_retry(job_id: str) -> Response | tuple[str, int]:
    settings = app_settings()
    with session_factory(settings)() as db:
        key = jobviews.own_job_or_404(db, job_id).id
    if not RetryForm().validate_on_submit():
        abort(400, description="retry with the button on the job's page")
    try:
        jobviews.retry_job(settings, key)
    except jobviews.RetryRefused as exc:
        abort(409, description=str(exc))
    return redirect(url_for("pages.job", job_id=key), code=303)


# --- dashboard ----------------------------------------------------------------------------


def _flower_url() -> str:
    """LANEWAY_FLOWER_URL, else Flower's port on the host and scheme this page came from
    (a page served over HTTPS links to Flower over HTTPS)."""
    settings = app_settings()
    if settings.flower_url:
        return settings.flower_url
    host = urlsplit(request.host_url).hostname or "localhost"
    host = f"[{host}]" if ":" in host else host  # an IPv6 address
    return f"{request.scheme}://{host}:{settings.flower_port}/"


@pages.get("/dashboard")
@signed_in
def dashboard() -> str:
    """The fleet as a whole: lanes, each lane's share by account type, workers, throughput
    and cost. The same page for every account, admin or not: no account's name or jobs."""
    settings = app_settings()
    with session_factory(settings)() as db:
        workers = jobviews.live_workers(db, settings)
        series = jobviews.throughput(db)
        cost = jobviews.cost_per_item(db, settings, series)
        shares = jobviews.lane_shares(db, settings)
    try:
        lanes = queue_depths(settings)
        interactive_items, interactive_cost = jobviews.interactive_usage(
            redis_client(settings), settings
        )
        series.update(interactive_items)
        cost.update(interactive_cost)
    except Exception:  # noqa: BLE001 - the page still shows the rest
        lanes = None
    step = jobviews.BUCKET_MINUTES
    ticks = [f"-{(jobviews.HOUR_BUCKETS - i) * step}m" for i in range(jobviews.HOUR_BUCKETS)]
    return render_template(
        "pages/dashboard.html",
        lanes=lanes,
        shares=shares,
        workers=workers,
        throughput_chart=charts.grouped_bars(
            series, ticks, "Items done per 5 minutes, last hour, by lane", "items"
        ),
        items_last_hour={lane: sum(v) for lane, v in series.items()},
        cost_chart=charts.bars(cost, "Dollars per item by lane, last hour", "${:.2e} per item"),
        flower_url=_flower_url(),
    )
