"""Every pair of a chunk's transitions that can meet, raced on the real Postgres.

Each pair is forced once into its dangerous interleaving (one side's locks held open in a
transaction of the test's while the other side runs for real), and raced in repeated
rounds of real threads started together. Whatever the order, no transition deadlocks or
waits past a bound, every chunk ends in a state its pair allows, and every item of a job
has exactly one outcome: a result for the items of finished chunks, none for cancelled
ones, counted once when the job is finalized once (jobs/chunks.py states the lock order
these tests hold the code to).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from db.common import chunk_items, chunks_of, utcnow
from db.models import Chunk, DeadLetter, Job, JobEvent, Result
from db.session import session_scope
from jobs import chunks
from jobs.chunks import JOB_LOCK_AT_START, Work
from jobs.lifecycle import cancel_job, settle
from tasks.chunks import _claim, _finish
from tasks.maintenance import recover_chunks
from tests.broker import empty_queues
from tests.factories import stored_job
from tests.locks import ends_or_waits, held

BOUND = 60  # seconds any one transition may take under the heaviest race here
ROUNDS = 3
HOST = "race@test"


@pytest.fixture
def app(settings, migrated, worker_app):
    """The worker's app on this run's Redis (halves and redispatched chunks are really
    sent to it), its queues emptied before and after."""
    worker_app(settings)
    empty_queues(settings, unacked=True)
    yield settings
    empty_queues(settings, unacked=True)


def _job(settings, n_chunks: int, size: int = 2) -> tuple:
    texts = [f"race text {n:04d}" for n in range(n_chunks * size)]
    return stored_job(settings, texts, chunk_size=size)


def _outputs(work: Work) -> list[dict]:
    return [{"label": "bug", "scores": {"bug": 1.0}} for _ in work.items]


def _run_out(work: Work) -> dict:
    """The worker's end of a run: every item a result (tasks.chunks._finish)."""
    return _finish(work, _outputs(work))


def _at_limit(settings, chunk_ids: list[int]) -> None:
    """These chunks' workers died on them as often as a chunk may start: the next claim
    (or the reconciler) splits them."""
    with session_scope(settings) as session:
        for chunk_id in chunk_ids:
            session.get(Chunk, chunk_id).attempts = chunks.attempt_limit(settings)


def _together(*sides: Callable[[], object]) -> list:
    """Run the sides on threads released by one barrier; every side's outcome, or the
    exception it raised. A side still running after BOUND seconds fails the test."""
    start = threading.Barrier(len(sides))

    def run(side: Callable[[], object]) -> object:
        start.wait()
        try:
            return side()
        except BaseException as exc:  # noqa: BLE001 - every failure is the finding
            return exc

    with ThreadPoolExecutor(len(sides)) as pool:
        futures = [pool.submit(run, side) for side in sides]
        outcomes = [f.result(timeout=BOUND) for f in futures]
    return outcomes


def _no_errors(outcomes: list) -> None:
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert errors == [], errors


def _runs(chunk_ids: list[int]) -> Callable[[], None]:
    """A worker's side: claim each chunk and run it to its end when it may run."""

    def side() -> None:
        for chunk_id in chunk_ids:
            work = _claim(HOST, chunk_id, "run")
            if work is not None:
                _run_out(work)

    return side


def _cancels(settings, jobs: list[tuple]) -> Callable[[], None]:
    """A user's side: cancel each job."""

    def side() -> None:
        for job_id, _ in jobs:
            cancel_job(job_id, settings)

    return side


def _reconciles(settings, passes: int = 4) -> Callable[[], None]:
    """Beat's side: reconcile a few times over."""

    def side() -> None:
        for _ in range(passes):
            recover_chunks(settings)

    return side


def _drain(settings, job_id) -> None:
    """What the fleet does with the job's messages left in the queue: each open chunk is
    claimed and, when it may run, run to its end."""
    for _ in range(8):  # halves of halves: a few generations at most
        with session_scope(settings) as session:
            open_ids = [c.id for c in chunks_of(session, job_id) if c.state == "queued"]
        if not open_ids:
            return
        for chunk_id in open_ids:
            work = _claim(HOST, chunk_id, "run")
            if work is not None:
                _run_out(work)
    raise AssertionError("the job's chunks kept reopening")


def _accounted(settings, job_id, allowed: set[str], *, final: bool = True) -> dict[str, int]:
    """Every item of the job lies in exactly one chunk that was not split, each such chunk
    in an allowed state; a finished chunk's items have one result each, a cancelled
    chunk's none; a final job counts each item once and was finalized once. Returns the
    number of chunks in each state."""
    with session_scope(settings) as session:
        job = session.get(Job, job_id)
        leaves = [c for c in chunks_of(session, job_id) if c.state != "split"]
        seen: dict[int, str] = {}
        for chunk in leaves:
            assert chunk.state in allowed, (chunk.id, chunk.state)
            for idx, _, _ in chunk_items(session, chunk):
                assert idx not in seen, f"item {idx} in two live chunks"
                seen[idx] = chunk.state
        assert sorted(seen) == list(range(job.total_items)), "an item lost its chunk"
        results = dict(
            session.execute(select(Result.idx, Result.error).where(Result.job_id == job_id)).all()
        )
        finished = {idx for idx, state in seen.items() if state in ("done", "failed")}
        assert set(results) == finished, "a result missing, or one of an unfinished chunk"
        finalized = session.scalar(
            select(func.count()).where(JobEvent.job_id == job_id, JobEvent.kind == "finalized")
        )
        if final:
            assert job.status in ("succeeded", "partial", "failed", "cancelled"), job.status
            assert finalized == 1
            ok = sum(1 for error in results.values() if error is None)
            assert job.succeeded_items == ok
            assert job.succeeded_items + job.failed_items + job.cancelled_items == len(seen)
        counts: dict[str, int] = {}
        for chunk in leaves:
            counts[chunk.state] = counts.get(chunk.state, 0) + 1
        return counts


# --- cancel vs claim ---------------------------------------------------------------------


def test_cancel_while_a_claim_holds_the_chunk_skips_it_and_the_claim_cancels_it(app):
    """The claim's first lock (the chunk) is held when the cancel comes: the cancel ends
    without waiting, and the claim, reading the job after it, cancels its chunk."""
    settings = app
    job_id, (first, *rest) = _job(settings, 3)
    with held(settings) as (claiming, pool):
        claiming.get(Chunk, first, with_for_update=True)
        cancel = pool.submit(cancel_job, job_id, settings)
        assert ends_or_waits(settings, cancel), "the cancel waits for a chunk being claimed"
        assert cancel.result(timeout=BOUND) == "cancelling"
        assert claiming.get(Job, job_id, with_for_update=JOB_LOCK_AT_START).status == "cancelling"
    assert _claim(HOST, first, "run") is None
    assert _accounted(settings, job_id, {"cancelled"}) == {"cancelled": 3}


def test_a_claim_while_the_cancel_holds_the_job_waits_then_cancels(app):
    """The cancel holds the job (its first lock) when the claim comes: the claim waits
    for the cancel's commit, then reads it and cancels its chunk instead of running."""
    settings = app
    job_id, (first, *_) = _job(settings, 2)
    with held(settings) as (cancelling, pool):
        # The cancel's first lock, as cancel_job takes it.
        job = cancelling.get(Job, job_id, with_for_update=True)
        claim = pool.submit(_claim, HOST, first, "run")
        assert not ends_or_waits(settings, claim), "a claim ran past a cancel holding its job"
        # The rest of the cancel, while the claim holds its chunk and waits for the job.
        job.status, job.cancel_requested_at = "cancelling", utcnow()
        chunks.cancel_not_started(cancelling, job_id, utcnow())
        cancelling.commit()
        assert claim.result(timeout=BOUND) is None
    settle(job_id, settings)
    assert _accounted(settings, job_id, {"cancelled"}) == {"cancelled": 2}


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_cancels_racing_claims_and_runs_lose_no_chunk(app, round_):
    """Jobs of four chunks: one thread claims and runs every chunk while another cancels
    every job. Each chunk ends done (claimed before the cancel) or cancelled."""
    settings = app
    jobs = [_job(settings, 4) for _ in range(6)]

    _no_errors(_together(_runs([c for _, ids in jobs for c in ids]), _cancels(settings, jobs)))
    for job_id, _ in jobs:
        _accounted(settings, job_id, {"done", "cancelled"})


# --- two claims of one chunk (a redelivery), and two copies finishing ----------------------


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_two_claims_of_one_chunk_both_run_and_one_result_per_item_stands(app, round_):
    """A redelivered message claims the chunk while the first copy claims it too: both
    run (the claim is per stage, not exclusive), both finish at once, one finish counts."""
    settings = app
    job_id, chunk_ids = _job(settings, 3)
    for chunk_id in chunk_ids:
        works = _together(*[lambda c=chunk_id: _claim(HOST, c, "run")] * 2)
        _no_errors(works)
        assert all(w is not None for w in works)
        outcomes = _together(*[lambda w=w: _run_out(w) for w in works])
        _no_errors(outcomes)
        assert sorted(bool(o.get("skipped")) for o in outcomes) == [False, True]
    with session_scope(settings) as session:
        assert {c.attempts for c in chunks_of(session, job_id)} == {2}
    assert _accounted(settings, job_id, {"done"}) == {"done": 3}


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_finish_vs_finish_of_every_chunk_of_a_job_finalizes_once(app, round_):
    """Two copies of each chunk of a job finish together, the chunks in opposite orders:
    one result per item, each chunk counted once, the job finalized once."""
    settings = app
    job_id, chunk_ids = _job(settings, 4)
    works = [_claim(HOST, chunk_id, "run") for chunk_id in chunk_ids]
    copies = [Work(**vars(w)) for w in works]

    def forward() -> list:
        return [_run_out(w) for w in works]

    def backward() -> list:
        return [_run_out(w) for w in reversed(copies)]

    outcomes = _together(forward, backward)
    _no_errors(outcomes)
    counted = [o for side in outcomes for o in side if not o.get("skipped")]
    assert sorted(o["chunk"] for o in counted) == sorted(chunk_ids)
    assert _accounted(settings, job_id, {"done"}) == {"done": 4}


# --- finish vs recover ---------------------------------------------------------------------


def test_the_reconciler_skips_a_chunk_being_finished(app):
    """A finish holds the chunk when the reconciler looks (its worker no longer beats):
    the reconciler neither waits nor sends it again, and the finish stands."""
    settings = app
    job_id, (first, *rest) = _job(settings, 2)
    work = _claim(HOST, first, "run")
    for chunk_id in rest:
        _run_out(_claim(HOST, chunk_id, "run"))
    with held(settings) as (finishing, pool):
        finishing.get(Chunk, first, with_for_update=True)
        recover = pool.submit(recover_chunks, settings)
        assert ends_or_waits(settings, recover), "the reconciler waits for a finish"
        assert recover.result(timeout=BOUND)["redispatched"] == []
    _run_out(work)
    assert _accounted(settings, job_id, {"done"}) == {"done": 2}


def test_a_finish_after_the_reconciler_sent_the_chunk_again_counts_once(app):
    """The reconciler gives the chunk up (its worker stopped beating) and sends it again;
    the first copy then finishes late, and the second copy's claim finds it done."""
    settings = app
    job_id, (first,) = _job(settings, 1)
    work = _claim(HOST, first, "run")
    assert recover_chunks(settings)["redispatched"] == [first]
    _run_out(work)
    assert _claim(HOST, first, "run") is None
    assert _accounted(settings, job_id, {"done"}) == {"done": 1}


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_finishes_racing_the_reconciler_lose_no_result(app, round_):
    """Every chunk of a job runs on a worker the reconciler thinks dead: one thread
    finishes them while another reconciles again and again. Each chunk ends done, or
    queued again (the fleet then runs it); the job ends with one result per item."""
    settings = app
    job_id, chunk_ids = _job(settings, 8)
    works = [_claim(HOST, chunk_id, "run") for chunk_id in chunk_ids]

    def finishes() -> None:
        for work in works:
            _run_out(work)

    _no_errors(_together(finishes, _reconciles(settings)))
    _accounted(settings, job_id, {"done", "queued"}, final=False)
    _drain(settings, job_id)
    assert _accounted(settings, job_id, {"done"}) == {"done": 8}


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_claims_racing_the_reconciler_on_lost_chunks_run_each_item_once(app, round_):
    """A job's messages were lost long ago: the reconciler sends its chunks again while a
    worker claims and runs them (a late delivery). Each chunk is run or queued again, and
    once the fleet has run what is queued, every item has exactly one result."""
    settings = app
    job_id, chunk_ids = _job(settings, 8)
    with session_scope(settings) as session:
        for chunk in chunks_of(session, job_id):
            chunk.queued_at = utcnow() - timedelta(seconds=settings.redispatch_after + 60)

    _no_errors(_together(_runs(chunk_ids), _reconciles(settings)))
    _accounted(settings, job_id, {"done", "queued"}, final=False)
    _drain(settings, job_id)
    assert _accounted(settings, job_id, {"done"}) == {"done": 8}


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_cancels_racing_the_reconciler_end_every_chunk_cancelled(app, round_):
    """Jobs whose chunks run on a worker that stopped beating are cancelled while the
    reconciler sends those chunks again. Whichever comes first, every chunk ends
    cancelled: by the reconciler, by the cancel, or by the claim of its new message."""
    settings = app
    jobs = [_job(settings, 3) for _ in range(5)]
    for _, chunk_ids in jobs:
        for chunk_id in chunk_ids:
            _claim(HOST, chunk_id, "run")

    _no_errors(_together(_reconciles(settings), _cancels(settings, jobs)))
    recover_chunks(settings)  # the next pass, for chunks still running on the dead worker
    for job_id, _ in jobs:
        _drain(settings, job_id)
        assert _accounted(settings, job_id, {"cancelled"}) == {"cancelled": 3}


# --- requeue vs cancel ---------------------------------------------------------------------


def test_a_cancel_while_a_retry_requeues_the_chunk_skips_it_and_the_retry_cancels_it(app):
    """The requeue holds the running chunk when the cancel comes: the cancel does not wait;
    the chunk goes back to the queue, and its retry's claim cancels it."""
    settings = app
    job_id, (first,) = _job(settings, 1)
    _claim(HOST, first, "run")
    with held(settings) as (requeueing, pool):
        # The requeue's update (jobs/chunks.requeue), not yet committed.
        chunk = requeueing.get(Chunk, first, with_for_update=True)
        chunk.state, chunk.worker_instance = "queued", None
        requeueing.flush()
        cancel = pool.submit(cancel_job, job_id, settings)
        assert ends_or_waits(settings, cancel), "the cancel waits for a requeue"
        assert cancel.result(timeout=BOUND) == "cancelling"
        requeueing.commit()
    assert _claim(HOST, first, "run") is None  # the retry's message
    assert _accounted(settings, job_id, {"cancelled"}) == {"cancelled": 1}


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_requeues_racing_cancels_end_every_chunk_cancelled(app, round_):
    """Every chunk of several jobs is running and fails (requeued for a retry) while the
    jobs are cancelled; the retries then arrive. Every chunk ends cancelled."""
    settings = app
    jobs = [_job(settings, 3) for _ in range(5)]
    for _, chunk_ids in jobs:
        for chunk_id in chunk_ids:
            _claim(HOST, chunk_id, "run")

    def requeues() -> None:
        for _, chunk_ids in jobs:
            for chunk_id in chunk_ids:
                chunks.requeue(settings, chunk_id)

    _no_errors(_together(requeues, _cancels(settings, jobs)))
    for job_id, _ in jobs:
        _drain(settings, job_id)
        assert _accounted(settings, job_id, {"cancelled"}) == {"cancelled": 3}


# --- settle vs a late finish ---------------------------------------------------------------


def test_a_finish_does_not_wait_for_a_settle_holding_the_job(app):
    """A settle's update holds the job row (FOR NO KEY UPDATE) when a chunk finishes: the
    finish's results only share the job's key, so it ends without waiting."""
    settings = app
    job_id, (first, second) = _job(settings, 2)
    work = _claim(HOST, first, "run")
    _run_out(_claim(HOST, second, "run"))
    with held(settings) as (settling, pool):
        settling.get(Job, job_id, with_for_update={"key_share": True})
        finish = pool.submit(chunks.finish, settings, work, _outputs(work))
        assert ends_or_waits(settings, finish), "a finish waits for a settle"
        assert not finish.result(timeout=BOUND).get("skipped")
    assert settle(job_id, settings) == "succeeded"
    assert _accounted(settings, job_id, {"done"}) == {"done": 2}


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_settles_racing_late_finishes_finalize_once_with_every_result(app, round_):
    """The job is cancelled while its chunks run; their finishes come late while other
    threads settle the job again and again. It is finalized once, after the last finish,
    and counts every result the finishes wrote."""
    settings = app
    job_id, chunk_ids = _job(settings, 6)
    works = [_claim(HOST, chunk_id, "run") for chunk_id in chunk_ids]
    assert cancel_job(job_id, settings) == "cancelling"
    settles: list = []

    def finishes() -> None:
        for work in works:
            _run_out(work)

    def settling() -> None:
        for _ in range(12):
            settles.append(settle(job_id, settings))

    _no_errors(_together(finishes, settling, settling))
    assert settles.count("cancelled") <= 1
    assert _accounted(settings, job_id, {"done"}) == {"done": 6}
    with session_scope(settings) as session:
        assert session.get(Job, job_id).succeeded_items == 12


def test_a_late_copy_finishing_after_the_job_was_finalized_changes_nothing(app):
    """The job was cancelled and finalized; a copy of a chunk that claimed before the
    cancel finishes afterwards. Its results are not written: the chunk had ended."""
    settings = app
    job_id, (first,) = _job(settings, 1)
    work = _claim(HOST, first, "run")
    cancel_job(job_id, settings)
    chunks.cancel(settings, first)  # the running copy saw the cancel and stopped
    assert settle(job_id, settings) == "cancelled"
    assert _run_out(work) == {"chunk": first, "skipped": True}
    assert _accounted(settings, job_id, {"cancelled"}) == {"cancelled": 1}


# --- exhaust vs cancel, exhaust vs exhaust -------------------------------------------------


def test_a_cancel_while_a_claim_would_split_the_chunk_cancels_it_whole(app):
    """A claim of a chunk at its start limit holds the chunk (it is about to split it)
    when the cancel comes: the cancel does not wait; the claim then reads the cancel and
    cancels the chunk whole rather than splitting it."""
    settings = app
    job_id, (first,) = _job(settings, 1, size=4)
    _at_limit(settings, [first])
    with held(settings) as (splitting, pool):
        splitting.get(Chunk, first, with_for_update=True)
        cancel = pool.submit(cancel_job, job_id, settings)
        assert ends_or_waits(settings, cancel), "the cancel waits for a split"
    assert _claim(HOST, first, "run") is None
    assert _accounted(settings, job_id, {"cancelled"}) == {"cancelled": 1}


def test_two_claims_splitting_chunks_of_one_job_do_not_deadlock(app):
    """One claim holds its chunk and reads the job (KEY SHARE) when another chunk of the
    job is claimed and split; the first then splits too. Each split waits its turn for
    the job; neither waits for the other's read, so neither deadlocks."""
    settings = app
    job_id, (first, second) = _job(settings, 2, size=4)
    _at_limit(settings, [first, second])
    with held(settings) as (claiming, pool):
        chunk = claiming.get(Chunk, first, with_for_update=True)
        claiming.get(Job, job_id, with_for_update=JOB_LOCK_AT_START)
        other = pool.submit(_claim, HOST, second, "run")
        assert ends_or_waits(settings, other), "a split waits for another claim's read"
        assert other.result(timeout=BOUND) is None
        halves = chunks.exhaust(claiming, chunk, "the test's split")
        claiming.commit()
        assert len(halves) == 2
    with session_scope(settings) as session:
        seqs = [c.seq for c in chunks_of(session, job_id)]
        assert len(seqs) == len(set(seqs)) == 6
    _drain(settings, job_id)
    assert _accounted(settings, job_id, {"done"}) == {"done": 4}


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_splits_racing_cancels_and_each_other_lose_no_item(app, round_):
    """Every chunk of several jobs is at its start limit: two threads claim them (each
    claim splits its chunk, and the two meet on each job) while a third cancels the jobs.
    No deadlock; every item ends in one live chunk, cancelled: a half made before the
    cancel is cancelled by it, a claim after it cancels its chunk unsplit."""
    settings = app
    jobs = [_job(settings, 4, size=4) for _ in range(4)]
    for _, chunk_ids in jobs:
        _at_limit(settings, chunk_ids)

    def claims(order: int) -> Callable[[], None]:
        def run() -> None:
            for _, chunk_ids in jobs:
                for chunk_id in chunk_ids[::order]:
                    _claim(HOST, chunk_id, "run")

        return run

    _no_errors(_together(claims(1), claims(-1), _cancels(settings, jobs)))
    for job_id, _ in jobs:
        _drain(settings, job_id)
        counts = _accounted(settings, job_id, {"cancelled"})
        with session_scope(settings) as session:
            assert session.get(Job, job_id).status == "cancelled"
            letters = session.scalar(select(func.count()).where(DeadLetter.job_id == job_id))
        assert letters == 0 and counts["cancelled"] >= 4
