"""Start-up objects out of the garbage collector's walks (core/config/startup.py), in the
interactive worker and in each web worker (gunicorn's hook)."""

from __future__ import annotations

import gc
import inspect
import weakref

import pytest

from core.config.settings import Settings
from core.config.startup import freeze_startup_objects
from fleet.processes import web_argv
from webapp import gunicorn_hooks


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_start_up_objects_are_frozen_and_later_cycles_still_collected(unfrozen):
    left_over = Node()
    left_over.other = Node()
    left_over.other.other = left_over  # garbage from start-up: collected, not frozen
    gone = weakref.ref(left_over)
    del left_over
    frozen = freeze_startup_objects()
    assert frozen > 1000 and gc.get_freeze_count() == frozen and gone() is None
    # What the process makes later is collected as before.
    later = Node()
    later.other = Node()
    later.other.other = later
    watch = weakref.ref(later)
    del later
    gc.collect()
    assert watch() is None
    # A full collection no longer walks the frozen objects.
    assert frozen > len(gc.get_objects(generation=2)) + len(gc.get_objects())


def test_each_web_worker_freezes_once_it_has_built_the_app(unfrozen):
    argv = web_argv(Settings.from_env({}), "127.0.0.1", 8000)
    assert argv[argv.index("--config") + 1] == "python:webapp.gunicorn_hooks"
    # gunicorn calls post_worker_init(worker): one argument.
    assert list(inspect.signature(gunicorn_hooks.post_worker_init).parameters) == ["worker"]
    gunicorn_hooks.post_worker_init(object())
    assert gc.get_freeze_count() > 1000


def test_each_web_worker_makes_its_database_engine_before_its_first_request(unfrozen):
    from types import SimpleNamespace
    from uuid import uuid4

    from db.session import _factory, session_factory

    # No connection is made: the engine and its driver only.
    url = f"postgresql+psycopg://postgres@127.0.0.1/laneway_hook_{uuid4().hex[:8]}"
    settings = Settings.from_env({"LANEWAY_DATABASE_URL": url})
    worker = SimpleNamespace(wsgi=SimpleNamespace(config={"LANEWAY_SETTINGS": settings}))
    before = _factory.cache_info()
    gunicorn_hooks.post_worker_init(worker)
    made = _factory.cache_info()
    assert made.misses == before.misses + 1
    session_factory(settings)  # the first request's look-up finds it made
    assert _factory.cache_info().misses == made.misses
    assert _factory.cache_info().hits == made.hits + 1
