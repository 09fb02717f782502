"""The one after-commit hook (db/session.py: after_commit) on the real Postgres: callbacks
run once the transaction has committed, in order, seeing its rows from another session;
never after a rollback, a failed commit or for a transaction other than their own."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from db.models import Account
from db.session import after_commit, session_factory, session_scope


def _name() -> str:
    return f"hook-{uuid.uuid4().hex[:8]}"


def _exists(settings, name: str) -> bool:
    with session_scope(settings) as other:
        return other.scalar(select(Account.id).where(Account.name == name)) is not None


def test_callbacks_run_after_the_commit_in_order_and_see_its_rows(settings, migrated):
    name, ran = _name(), []
    with session_scope(settings) as session:
        session.add(Account(name=name, type="trial"))
        after_commit(session, lambda: ran.append(("first", _exists(settings, name))))
        after_commit(session, lambda: ran.append(("second", _exists(settings, name))))
        session.flush()
        assert ran == []  # not before the commit, not at a flush
    # A message sent by the callback finds its rows: another session already sees them.
    assert ran == [("first", True), ("second", True)]


def test_a_rollback_drops_the_callbacks(settings, migrated):
    ran = []
    with pytest.raises(RuntimeError), session_scope(settings) as session:
        session.add(Account(name=_name(), type="trial"))
        after_commit(session, lambda: ran.append("sent"))
        raise RuntimeError("the request failed half way")
    assert ran == []


def test_a_failed_commit_runs_no_callback(settings, migrated):
    name, ran = _name(), []
    with session_scope(settings) as session:
        session.add(Account(name=name, type="trial"))
    with pytest.raises(IntegrityError), session_scope(settings) as session:
        session.add(Account(name=name, type="trial"))  # the same unique name: fails at commit
        after_commit(session, lambda: ran.append("sent"))
    assert ran == []


def test_callbacks_belong_to_their_transaction_only(settings, migrated):
    ran = []
    with session_factory(settings)() as session:
        after_commit(session, lambda: ran.append("first transaction"))
        session.commit()
        session.add(Account(name=_name(), type="trial"))
        session.commit()  # a later transaction of the same session: nothing runs again
        after_commit(session, lambda: ran.append("rolled back"))
        session.rollback()
        session.commit()
    assert ran == ["first transaction"]


def test_a_savepoint_rolled_back_keeps_the_outer_transactions_callbacks(settings, migrated):
    ran = []
    with session_scope(settings) as session:
        after_commit(session, lambda: ran.append("outer"))
        nested = session.begin_nested()
        session.add(Account(name=_name(), type="trial"))
        nested.rollback()
    assert ran == ["outer"]


def test_a_failing_callback_reaches_the_caller_after_the_rows_are_committed(settings, migrated):
    name = _name()

    def broker_down() -> None:
        raise ConnectionError("the broker is away")

    with pytest.raises(ConnectionError), session_scope(settings) as session:
        session.add(Account(name=name, type="trial"))
        after_commit(session, broker_down)
    assert _exists(settings, name)  # stored; the reconciler sends what was not sent
