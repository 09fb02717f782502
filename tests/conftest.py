"""Test services: a fresh Postgres database and a private Redis db index per test run.

Both are real. The settings' variables are set when pytest starts, before any module reads
them (tasks/app.py builds its Celery app from them at import); the services are touched only
when a test asks for them (the `services` fixture, under `settings`), so a run of pure unit
tests needs neither. The database is created on first use and dropped at the end; the Redis
index is claimed in db 0 so that concurrent runs on one machine never share one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import redis

PG_ADMIN = os.environ.get("LANEWAY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_HOST = os.environ.get("LANEWAY_TEST_REDIS", "redis://127.0.0.1:6379")
# A service that does not answer fails the tests that need it within seconds, not minutes.
CONNECT_TIMEOUT_S = 5

# tests/spawnguard.py: a test that starts a process carries the e2e or slow marker.
pytest_plugins = ["tests.spawnguard", "tests.cpumeter", "pytester"]

_state: dict[str, object] = {}


def _admin() -> psycopg.Connection:
    return psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)


def database_url(name: str) -> str:
    base = PG_ADMIN.rsplit("/", 1)[0]
    return f"{base}/{name}".replace("postgresql://", "postgresql+psycopg://", 1)


def create_database(name: str) -> str:
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(name)


def drop_database(name: str) -> None:
    with _admin() as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (name,),
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S)


def _claim_redis_index() -> int:
    r = _redis(f"{REDIS_HOST}/0")
    for index in range(1, 16):
        if r.set(f"laneway:test-db:{index}", os.getpid(), nx=True, ex=3 * 3600):
            return index
    raise RuntimeError("every Redis db index 1..15 is claimed by another test run")


def _xdist_controller(config: pytest.Config) -> bool:
    """Whether this process is pytest-xdist's controller (`-n N`), which hands tests to its
    workers and runs none: each worker is a run of its own, with its own database and Redis
    index, so that parallel workers never see each other's jobs, queues or fleets."""
    if hasattr(config, "workerinput"):
        return False
    return getattr(config.option, "dist", "no") != "no" and bool(
        getattr(config.option, "numprocesses", None)
    )


def pytest_configure(config: pytest.Config) -> None:
    """Point every LANEWAY_* setting at this run's services before any module reads them.

    The Redis index is part of LANEWAY_REDIS_URL, which modules read at import, so it is
    claimed here: one round trip when Redis answers. When it does not, the run goes on
    without it and the tests that need it fail in `services`, saying so.
    """
    if "LANEWAY_MODEL_CACHE_DIR" not in os.environ:
        # One folder for the whole run, its xdist workers included (they inherit the
        # controller's environment): each precision check and ONNX export of a model runs
        # once per run, not once for every worker and fleet home the tests make.
        cache = tempfile.mkdtemp(prefix="laneway-test-models-")
        os.environ["LANEWAY_MODEL_CACHE_DIR"] = _state["model_cache"] = cache
    if _xdist_controller(config):
        return  # it runs no test: each of its workers claims its own database and index
    db_name = f"laneway_test_{uuid.uuid4().hex[:10]}"
    try:
        index = _claim_redis_index()
    except redis.RedisError as error:
        _state["redis_error"] = f"{type(error).__name__}: {error}"
        index = 0  # never used: Redis did not answer, and `services` stops every test that asks
    else:
        _state["index"] = index
    redis_url = f"{REDIS_HOST}/{index}"
    home = tempfile.mkdtemp(prefix="laneway-test-")
    _state.update(db_name=db_name, redis_url=redis_url)
    os.environ.update(
        LANEWAY_DATABASE_URL=database_url(db_name),
        LANEWAY_REDIS_URL=redis_url,
        LANEWAY_HOME=home,
        LANEWAY_CHUNK_SIZE="16",
        # Every chunk 16 items: sizing from measured speed (tests/unit/test_planner.py,
        # tests/integration/test_chunk_sizing.py) must not change later tests' chunks.
        LANEWAY_CHUNK_SECONDS="0",
        LANEWAY_GPU_THRESHOLD="40",
        # Lanes by the threshold: what earlier tests measured must not move later tests'
        # jobs to the other lane (routing by measured costs is tested on its own).
        LANEWAY_ROUTING="threshold",
        LANEWAY_TORCH_THREADS="1",
        # The interactive path (issue 6): no result cache (tests that want it turn it on),
        # and batch workers at normal priority that never step aside for interactive work.
        LANEWAY_CACHE_TTL="0",
        LANEWAY_BATCH_NICE="0",
        LANEWAY_BATCH_YIELD_MAX="0",
        HF_HUB_OFFLINE="1",
    )
    os.environ.pop("LANEWAY_GPU_FALLBACK", None)


def pytest_unconfigure(config: pytest.Config) -> None:
    # Only the folder this process made with mkdtemp (never one the environment named),
    # once its xdist workers are done.
    if "model_cache" in _state:
        shutil.rmtree(str(_state["model_cache"]), ignore_errors=True)
    if "db_name" not in _state:
        return
    from tests.e2e.procs import stop_started_since

    stop_started_since(0)  # no worker may outlive the database and Redis db it was given
    if "index" in _state:
        _redis(str(_state["redis_url"])).flushdb()
        _redis(f"{REDIS_HOST}/0").delete(f"laneway:test-db:{_state['index']}")
    if _state.get("db_created"):
        drop_database(str(_state["db_name"]))


# `make test` hands whole files to its xdist workers in collection order (`--dist loadfile
# --no-loadscope-reorder`), each worker taking the next file as it runs out: the longest
# files go first and the unit tests, many and short, last, so that both workers run out of
# work together rather than one idling while the other runs a long file last. The files
# that run longest, longest first (`--durations`), then each folder, the slowest first.
LONGEST_FILES = (
    "tests/e2e/test_calibrate_plan.py",
    "tests/faults/test_redis_flushed.py",
    "tests/e2e/test_gpu_lane.py",
    "tests/e2e/test_die_together.py",
    "tests/e2e/test_tracing.py",
    "tests/faults/test_worker_killed.py",
    "tests/faults/test_poison.py",
    "tests/e2e/test_interactive_under_load.py",
    "tests/faults/test_postgres_restarted.py",
    "tests/faults/test_second_beat.py",
)
FOLDERS_SLOWEST_FIRST = ("tests/e2e/", "tests/faults/", "tests/integration/", "tests/unit/")


def run_order(nodeid: str) -> tuple[int, int]:
    """Where a test's file comes in `make test`'s order (a file's tests keep theirs)."""
    path = nodeid.split("::", 1)[0]
    if path in LONGEST_FILES:
        return 0, LONGEST_FILES.index(path)
    folder = next((i for i, f in enumerate(FOLDERS_SLOWEST_FIRST) if path.startswith(f)), 99)
    return 1, folder


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first in an xdist worker (every worker sorts alike, so their
    collections agree); a run in one process keeps the collection's order (testpaths: the
    fast, in-process tests first)."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: run_order(item.nodeid))  # stable: files stay whole


@pytest.fixture(scope="session")
def services() -> None:
    """This run's database (created here, on first use) and its Redis index (emptied here):
    what every test that reaches Postgres or Redis stands on, through `settings`."""
    if "redis_error" in _state:
        pytest.fail(
            f"this test needs Redis at {REDIS_HOST} (LANEWAY_TEST_REDIS), which did not "
            f"answer when the run began: {_state['redis_error']}",
            pytrace=False,
        )
    try:
        create_database(str(_state["db_name"]))
    except psycopg.OperationalError as error:
        pytest.fail(
            f"this test needs Postgres at {PG_ADMIN} (LANEWAY_TEST_PG), which did not "
            f"answer: {error}".strip(),
            pytrace=False,
        )
    _state["db_created"] = True
    try:
        _redis(str(_state["redis_url"])).flushdb()
    except redis.RedisError as error:
        pytest.fail(
            f"this test needs Redis at {REDIS_HOST} (LANEWAY_TEST_REDIS): {error}", pytrace=False
        )


@pytest.fixture(scope="session")
def settings(services):
    from core.config.settings import Settings

    return Settings.from_env()


@pytest.fixture(autouse=True)
def _celery_default_app() -> Iterator[None]:
    """Each test leaves the process's default Celery app as it found it: a test that
    builds one from its own settings (create_app, make_celery) sets it as the default,
    and tasks run in this process read the settings of the default app."""
    from celery import _state

    before = _state.default_app, getattr(_state._tls, "current_app", None)
    yield
    _state.set_default_app(before[0])
    _state._tls.current_app = before[1]


@pytest.fixture
def worker_app():
    """The worker's Celery app built from the given settings (what `celery -A tasks`
    builds from the environment): tasks run in this test read them, nothing patched."""
    from core.queueing.celery_app import make_celery
    from tasks.app import TASK_MODULES

    return lambda settings: make_celery(settings, include=TASK_MODULES)


@pytest.fixture(scope="session")
def migrated(settings) -> None:
    from db.migrate import upgrade

    upgrade(settings)


@pytest.fixture
def db_session(settings, migrated) -> Iterator:
    """A session inside an outer transaction that is rolled back after the test."""
    from sqlalchemy.orm import Session

    from db.session import session_factory

    engine = session_factory(settings).kw["bind"]
    with engine.connect() as conn:
        trans = conn.begin()
        session = Session(bind=conn, join_transaction_mode="create_savepoint")
        try:
            yield session
        finally:
            session.close()
            trans.rollback()


@pytest.fixture
def account_factory(settings, migrated):
    """Create committed accounts (the web app and workers read them from other sessions)."""
    from db.accounts import create_account
    from db.session import session_scope

    def make(type_: str = "standard", is_admin: bool = False):
        with session_scope(settings) as session:
            account, key = create_account(
                session, f"acct-{uuid.uuid4().hex[:8]}", type_, is_admin=is_admin
            )
            session.expunge(account)
        return account, key

    return make


@pytest.fixture(params=["redis", "rabbitmq"])
def lanes(request, settings, monkeypatch):
    """The settings of a test run on each broker of the batch lanes: this run's Redis, or a
    RabbitMQ vhost of the test's own (tests/rabbit.py), which every process it starts uses."""
    if request.param == "redis":
        yield settings
        return
    from tests.rabbit import on_rabbitmq

    with on_rabbitmq(settings, monkeypatch) as rabbit:
        yield rabbit
