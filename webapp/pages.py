"""Web pages: sign in with an API key (kept as a signed session), sign out, a landing page.

The foundation the real pages build on: every form carries a CSRF token (Flask-WTF), the
session cookie is HttpOnly, SameSite=Lax and Secure, and pages are never cached.
"""

from __future__ import annotations

from flask import Blueprint, Response, g, redirect, render_template, session, url_for
from flask_wtf import FlaskForm
from wtforms import PasswordField
from wtforms.validators import DataRequired, Length

from db.queries import live_key
from db.session import session_factory
from webapp.auth import app_settings

pages = Blueprint("pages", __name__)


class LoginForm(FlaskForm):
    api_key = PasswordField("API key", validators=[DataRequired(), Length(max=200)])


class LogoutForm(FlaskForm):
    """No fields: the CSRF token alone, so another site cannot sign a user out."""


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
    session.clear()
    session.permanent = True
    # The key's row id, never the key: the cookie is signed, not encrypted.
    session["key_id"] = key_id
    return redirect(url_for("pages.home"), code=303)


@pages.post("/logout")
def logout() -> Response | tuple[str, int]:
    form = LogoutForm()
    if not form.validate_on_submit():
        message = "sign out with the button on the page"
        return render_template("pages/error.html", code=400, message=message), 400
    session.clear()
    return redirect(url_for("pages.login"), code=303)


@pages.get("/")
def home() -> Response | str:
    if g.account is None:
        return redirect(url_for("pages.login"), code=303)
    limits = app_settings().limits_for(g.account.type)
    return render_template(
        "pages/home.html",
        account=g.account,
        limits=limits,
        key_prefix=g.key_prefix,
        logout=LogoutForm(),
    )
