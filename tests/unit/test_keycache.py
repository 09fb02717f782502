"""The web process's trusted API keys (webapp/keycache.py), with a clock of the test's own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from db.models import Account
from tests.later import Later
from webapp.keycache import MAX_KEYS, KeyCache, read_only


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _row(prefix="lw_0123456789ab", revoked_at=None, type_="trial", account_id=7):
    return prefix, revoked_at, {"id": account_id, "name": "acme", "type": type_, "is_admin": False}


class LookUps:
    """A stand-in for the database: what it answers, and how often it was asked."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.answer


def test_a_key_is_looked_up_once_per_ttl():
    clock, db = Clock(), LookUps(_row())
    cache = KeyCache(2.0, clock)
    for _ in range(5):
        account, prefix = cache.find("lw_0123456789ab_secret", db)
        assert (account.id, account.type, prefix) == (7, "trial", "lw_0123456789ab")
    assert db.calls == 1
    clock.now += 1.99
    cache.find("lw_0123456789ab_secret", db)
    assert db.calls == 1
    clock.now += 0.02  # past the TTL: asked again
    cache.find("lw_0123456789ab_secret", db)
    assert db.calls == 2


def test_a_revocation_in_the_database_is_honoured_within_the_ttl():
    clock, db = Clock(), LookUps(_row())
    cache = KeyCache(2.0, clock)
    assert cache.find("k_a_b", db) is not None
    db.answer = None  # revoked by another process: live_key finds no live key any more
    clock.now += 2.0
    assert cache.find("k_a_b", db) is None
    # And it stays refused: a key not found is forgotten, never kept.
    assert cache.find("k_a_b", db) is None and db.calls == 3 and len(cache) == 0


def test_a_change_of_account_type_reaches_the_process_within_the_ttl():
    clock, db = Clock(), LookUps(_row(type_="trial"))
    cache = KeyCache(1.0, clock)
    assert cache.find("k_a_b", db)[0].type == "trial"
    db.answer = _row(type_="demo")
    assert cache.find("k_a_b", db)[0].type == "trial"
    clock.now += 1.0
    assert cache.find("k_a_b", db)[0].type == "demo"


def test_a_rotated_keys_revocation_moment_takes_effect_on_time_not_at_the_ttl():
    # The copy says "revoked a moment ago" (a rotation's grace ended): refused at once,
    # however fresh the copy.
    past = datetime.now(UTC) - timedelta(seconds=1)
    clock, db = Clock(), LookUps(_row(revoked_at=past))
    cache = KeyCache(60.0, clock)
    assert cache.find("k_a_b", db) is None
    future = datetime.now(UTC) + timedelta(hours=1)
    db.answer = _row(revoked_at=future)
    cache.clear()
    assert cache.find("k_a_b", db) is not None


def test_unknown_keys_are_never_kept_so_a_new_key_works_at_once():
    clock, db = Clock(), LookUps(None)
    cache = KeyCache(2.0, clock)
    assert cache.find("k_new_key", db) is None
    db.answer = _row()  # the key was created a moment later
    assert cache.find("k_new_key", db) is not None
    assert db.calls == 2


def test_every_request_gets_an_account_object_of_its_own():
    clock, db = Clock(), LookUps(_row())
    cache = KeyCache(2.0, clock)
    first, _ = cache.find("k_a_b", db)
    first.type = "enterprise"  # a view that changed its copy changes nobody else's
    second, _ = cache.find("k_a_b", db)
    assert second is not first and second.type == "trial"


def test_a_read_only_account_has_the_columns_and_is_a_copy_all_the_same():
    clock, db = Clock(), LookUps(_row(type_="standard", account_id=9))
    cache = KeyCache(2.0, clock)
    first, prefix = cache.find("k_a_b", db, read_only)
    assert (first.id, first.type, first.name, first.is_admin) == (9, "standard", "acme", False)
    assert prefix == "lw_0123456789ab" and not isinstance(first, Account)
    first.type = "enterprise"
    second, _ = cache.find("k_a_b", db)  # the ORM object, from the same kept columns
    assert second.type == "standard" and db.calls == 1


def test_ttl_zero_looks_up_every_request_and_keeps_nothing():
    clock, db = Clock(), LookUps(_row())
    cache = KeyCache(0.0, clock)
    for _ in range(3):
        assert cache.find("k_a_b", db) is not None
    assert db.calls == 3 and len(cache) == 0


def test_keys_are_kept_by_hash_never_in_clear_and_the_cache_is_bounded():
    clock, db = Clock(), LookUps(_row())
    cache = KeyCache(2.0, clock)
    cache.find("lw_0123456789ab_the-secret-part", db)
    assert "the-secret-part" not in repr(cache._known)
    for n in range(MAX_KEYS + 5):
        cache.find(f"k_{n}_x", db)
    assert len(cache) == MAX_KEYS


def test_the_setting_is_bounded_and_names_itself():
    import pytest

    from core.config.settings import Settings, SettingsError

    assert Settings.from_env({}).auth_cache_seconds == 2.0
    assert Settings.from_env({"LANEWAY_AUTH_CACHE_SECONDS": "0"}).auth_cache_seconds == 0
    for bad in ("-1", "nan", "inf", "61", "soon"):
        with pytest.raises(SettingsError, match="LANEWAY_AUTH_CACHE_SECONDS"):
            Settings.from_env({"LANEWAY_AUTH_CACHE_SECONDS": bad})


def test_a_key_in_use_is_read_ahead_and_no_request_waits_on_the_database():
    clock, db, later = Clock(), LookUps(_row()), Later()
    cache = KeyCache(2.0, clock, refresh=later)
    cache.find("k_a_b", db)
    assert db.calls == 1
    clock.now += 0.9  # within the first half of the TTL: nothing ahead
    cache.find("k_a_b", db)
    assert later.jobs == []
    clock.now += 0.2  # past it: one read ahead, queued, whatever the requests
    for _ in range(3):
        assert cache.find("k_a_b", db) is not None
    assert db.calls == 1 and len(later.jobs) == 1
    later.run()  # the pool's thread reads at 1001.1: trusted until 1003.1
    assert db.calls == 2
    clock.now += 1.9  # past the first copy's end (1002.0), inside the new one's
    assert cache.find("k_a_b", db) is not None and db.calls == 2


def test_a_revocation_read_ahead_ends_the_key_before_its_copy_would_have():
    clock, db, later = Clock(), LookUps(_row()), Later()
    cache = KeyCache(2.0, clock, refresh=later)
    cache.find("k_a_b", db)
    clock.now += 1.5
    cache.find("k_a_b", db)
    db.answer = None  # revoked in Postgres
    later.run()
    assert len(cache) == 0
    assert cache.find("k_a_b", db) is None  # refused at once, asked inline again


def test_a_read_ahead_that_fails_leaves_the_copy_to_lapse_on_time(caplog):
    clock, db, later = Clock(), LookUps(_row()), Later()
    cache = KeyCache(2.0, clock, refresh=later)
    cache.find("k_a_b", db)
    clock.now += 1.5

    def away():
        raise OSError("database away")

    assert cache.find("k_a_b", away) is not None  # served from the copy; a read queued
    cache.find("k_a_b", away)  # one read at a time per key
    assert len(later.jobs) == 1
    later.run()
    assert "could not read an API key ahead: OSError" in caplog.text
    cache.find("k_a_b", db)  # the failed read is over: another may go
    assert len(later.jobs) == 1
    clock.now += 0.6  # past 1002.0: the copy lapsed, the request reads inline
    db.answer = None
    assert cache.find("k_a_b", db) is None
