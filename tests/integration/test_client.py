"""laneway.Client against the real web app in this process (httpx's WSGI transport) and
AsyncClient against it served over HTTP, on the run's Postgres and Redis: jobs, results
streamed, cancel, dead letters, listing, the errors raised, a rate-limited submission
retried until it goes through, and a submission whose answer was lost sent again."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from laneway import AsyncClient, Backoff, Client, Job, LanewayError, Result, Retry
from sqlalchemy import func, select

from db.models import Job as JobRow
from db.session import session_scope
from tests.integration.conftest import store_results


@pytest.fixture
def connect(app):
    def make(key: str, app=app, **kwargs) -> Client:
        transport = httpx.WSGITransport(app=app)
        return Client("http://laneway.test", key, transport=transport, **kwargs)

    return make


def test_submit_results_cancel_and_retry(connect, account_factory):
    _, key = account_factory()
    client = connect(key)
    job = client.submit(["first", ("b", "second"), {"id": "c", "text": "third"}], tasks="embed")
    assert client.job(job["id"])["progress"]["total"] == 3
    output = {"embedding": [0.5], "tokens": 3}
    rows = [{"idx": n, "item_id": i, "output": output} for n, i in enumerate(("0", "b", "c"))]
    store_results(job["id"], rows)
    assert [r["id"] for r in client.results(job["id"])] == ["0", "b", "c"]
    assert next(iter(client.results(job["id"])))["tokens"] == 3
    assert client.cancel(job["id"])["status"] in ("cancelling", "cancelled")
    assert client.dead_letters(job["id"]) == {"dead_letters": []}
    with pytest.raises(LanewayError) as err:
        client.retry(job["id"])
    assert err.value.status == 409


def test_errors_are_raised_with_the_servers_code(connect, account_factory):
    (_, key), (_, other) = account_factory(), account_factory()
    job = connect(key).submit(["mine"])
    with pytest.raises(LanewayError) as err:
        connect(other).job(job["id"])  # another account's job does not exist for it
    assert (err.value.status, err.value.code) == (404, "not_found")
    with pytest.raises(LanewayError) as err:
        connect(key).submit([{"id": "1", "text": "a"}, {"id": "1", "text": "b"}])
    assert err.value.code == "invalid_input" and "duplicate id" in err.value.message
    with pytest.raises(LanewayError) as err:
        connect("lw_wrong").account()
    assert err.value.status == 401
    with pytest.raises(LanewayError) as err:
        connect(key).embeddings("hello", model="gpt-4")  # OpenAI's error shape, read alike
    assert (err.value.status, err.value.code) == (404, "model_not_found")


def test_a_rate_limited_client_waits_and_goes_through(make_app, settings, account_factory, connect):
    limits = dict(settings.account_limits)
    limits["demo"] = type(limits["demo"])("2/second", 10, 1 << 20)
    app = make_app(account_limits=limits)
    _, key = account_factory("demo")
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        __import__("time").sleep(seconds)

    client = connect(key, app=app, backoff=Backoff(retries=10, cap=2.0), sleep=sleep)
    jobs = [client.submit([f"text {n}"])["id"] for n in range(5)]
    assert len(set(jobs)) == 5  # every one stored once, none twice
    assert slept and all(0 < s <= 2.0 for s in slept)


class _LosesTheFirstAnswer(httpx.BaseTransport):
    """The network between client and app: the first submission reaches the app and is
    stored, but its answer never comes back (a read error), as on a flaky link."""

    def __init__(self, app) -> None:
        self.inner = httpx.WSGITransport(app=app)
        self.lost = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == "POST" and request.url.path == "/v1/jobs" and not self.lost:
            self.lost += 1
            raise httpx.ReadError("connection reset by peer", request=request)
        return response


def _jobs_of(settings, account_id: int) -> int:
    with session_scope(settings) as session:
        return session.scalar(select(func.count()).where(JobRow.account_id == account_id))


def test_a_submission_whose_answer_was_lost_is_stored_once(app, account_factory, settings):
    account, key = account_factory()
    network = _LosesTheFirstAnswer(app)
    client = Client("http://laneway.test", key, transport=network, sleep=lambda _: None)
    job = client.submit(["sent twice, stored once"])
    assert network.lost == 1  # the app stored the first, the client never heard
    assert isinstance(job, Job) and job.status == "queued"
    assert _jobs_of(settings, account.id) == 1
    assert [j.id for j in client.iter_jobs()] == [job.id]


def test_answers_are_typed_and_still_read_by_key(connect, account_factory):
    _, key = account_factory()
    client = connect(key)
    job = client.submit([("x", "typed")], tasks="score")
    assert (job.lane, job.links["self"]) == ("cpu", f"/v1/jobs/{job.id}")
    assert job["id"] == job.id and job.get("nothing") is None
    full = client.job(job.id)
    assert full.progress.total == 1 and full.tasks == ["score"] and not full.ended
    store_results(job.id, [{"idx": 0, "item_id": "x", "output": {"rating": 0.5}}])
    (record,) = client.results(job.id)
    assert isinstance(record, Result) and (record.id, record.rating, record.label) == (
        "x",
        0.5,
        None,
    )
    assert record["rating"] == 0.5


def test_listing_pages_and_filters(connect, account_factory):
    _, key = account_factory()
    client = connect(key)
    ids = [client.submit([f"text {n}"]).id for n in range(5)]
    page = client.jobs(limit=2)
    assert [j.id for j in page] == ids[:-3:-1] and page.next_cursor
    assert [j.id for j in client.iter_jobs(page=2)] == ids[::-1]
    client.cancel(ids[0])
    assert [j.id for j in client.jobs(status=["cancelled", "cancelling"])] == [ids[0]]
    with pytest.raises(LanewayError) as err:
        client.jobs(status="finished")
    assert err.value.status == 400 and "'finished'" in err.value.message


def test_the_async_client_over_http(served, account_factory):
    _, key = account_factory()

    async def main():
        async with AsyncClient(served, key) as client:
            job = await client.submit(["one", "two"], tasks="embed")
            again = await client.submit(["one", "two"], tasks="embed", idempotency_key="k")
            same = await client.submit(["one", "two"], tasks="embed", idempotency_key="k")
            assert same.id == again.id != job.id
            store_results(job.id, [
                {"idx": n, "item_id": str(n), "output": {"embedding": [0.1], "tokens": 2}}
                for n in range(2)
            ])  # fmt: skip
            records = [r async for r in client.results(job.id)]
            listed = [j.id async for j in client.iter_jobs(page=1)]
            with pytest.raises(LanewayError) as err:
                await client.job("00000000-0000-0000-0000-000000000000")
            return job, records, listed, err.value

    job, records, listed, missing = asyncio.run(main())
    assert [r.tokens for r in records] == [2, 2]
    assert listed[-1] == job.id and len(listed) == 2
    assert missing.status == 404


def test_the_inline_fallback_job_is_waited_for_only_so_long(make_app, account_factory):
    # No interactive worker runs here: the request becomes a job (202) at once, and no
    # worker runs that either; the wait ends at job_timeout, naming the job.
    app = make_app(sync_timeout=0.0, sync_max_wait=0.0, anonymous_rate_limit="100000/minute")
    _, key = account_factory()
    client = Client("http://laneway.test", key, transport=httpx.WSGITransport(app=app))
    with pytest.raises(TimeoutError, match="still queued after 0.5 s"):
        client.classify(["late"], labels=["a", "b"], wait=0, job_timeout=0.5)


def test_a_refused_connection_raises_one_error_naming_it():
    client = Client("http://127.0.0.1:9", "lw_x", retry=Retry(retries=1, base=0.01))
    with pytest.raises(LanewayError) as err:
        client.job("anything")
    assert err.value.code == "connection_error"
    assert "cannot reach Laneway at http://127.0.0.1:9" in str(err.value)
