"""Fair share: which waiting chunks get a lane's free slots.

Every chunk of a job is stored `held`: in Postgres, with no broker message. Each lane
keeps a *window* of chunks in flight (queued in the broker or running): a few per worker
process serving it (`LANEWAY_WINDOW_PER_WORKER`, at least `LANEWAY_MIN_WINDOW`, at most
`LANEWAY_LANE_LIMIT_<LANE>`), enough that a worker always finds its next chunk waiting, few
enough that a job submitted now waits behind a handful of chunks, not behind another
account's million items. `refill` tops the window up whenever room may have freed or work
arrived: after a job is stored, after each chunk ends, and in every reconciler round.

Which account gets a free slot is start-time fair queuing (Goyal, Vin and Cheng, 1996),
the rule behind weighted fair queuing and SLURM's and Kueue's fair sharing by weight:
each account has a *pass* on each lane, the items the lane gave it, each divided by the
account's weight when given. The waiting account with the lowest pass gets the next slot,
and its pass grows by that chunk's items over its weight, so accounts that keep work
waiting get items in proportion to their weights, and an account alone gets every slot.
The lane keeps a clock, the pass at which its last given chunk started; an account that
arrives (or comes back) starts there: it gets no credit for time it did not wait, and
goes before the next chunk of an account already being served.
Within an account, its oldest job goes first.

A window rather than the broker's priorities: a priority orders messages already sent,
so a job sent whole still holds the broker, the web process that sends it and the
reconciler's view for its whole size, and weights cannot be expressed at all; the window
keeps what is sent bounded, whatever the jobs' sizes.

Refills of one lane take turns on a Postgres advisory lock held to their commit (rule 0
of jobs/chunks.py's lock order), so two never read the same free slots; each takes only
held chunks, `SKIP LOCKED`, and nothing holds a chunk while waiting for the lane's lock.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from core.config.settings import Settings
from core.queueing.dispatch import send_chunks
from core.vocab import LANES
from db import common
from db.accounts import weight_in_effect
from db.common import utcnow
from db.intake import ChunkRef
from db.models import Account, Chunk, Job, LaneClock, LaneShare, Worker
from db.session import after_commit, session_scope
from jobs import chunks

log = logging.getLogger(__name__)

IN_FLIGHT = ("queued", "running")
# Jobs whose held chunks may be given slots (a cancelling job's are being cancelled).
SERVED_JOB_STATUSES = ("queued", "running")
# pg_advisory_xact_lock keys, one per lane: refills of a lane take turns.
LANE_LOCK = {"cpu": 0x4C4E5301, "gpu": 0x4C4E5302}
# How far back a lane's recent throughput is read for the estimates.
RATE_WINDOW = timedelta(minutes=5)


def chunk_items(chunk: Chunk | Any) -> int:
    """Items a chunk holds: the positions it names, else its range."""
    return len(chunk.positions) if chunk.positions is not None else chunk.stop - chunk.start


# --- the pure rule --------------------------------------------------------------------


@dataclass
class Standing:
    """One account's standing on a lane, as a refill sees it."""

    account_id: int
    weight: float
    passed: float  # its stored pass (0 when it was never served)
    in_flight_items: int = 0
    # Its jobs with held chunks, oldest first: [job id, held chunks, items per chunk].
    jobs: list[list[Any]] = field(default_factory=list)
    name: str = ""
    type: str = ""


@dataclass
class Allocation:
    picks: list[uuid.UUID]  # the jobs the next chunks come from, in order
    start: dict[int, float]  # each account's pass raised to the clock, before its picks
    clock: float  # the lane's clock after these picks


def allocate(accounts: list[Standing], slots: int, clock: float) -> Allocation:
    """Give up to `slots` chunks: each to the waiting account with the lowest pass (a tie
    to the one with less in flight, then the lower id), its pass growing by the chunk's
    items over its weight. `clock` is the pass at which the lane's last given chunk
    started: an account whose pass is behind it (new, or back from idle) starts there."""
    start = {a.account_id: max(a.passed, clock) for a in accounts}
    passes = dict(start)
    queues = {a.account_id: [list(j) for j in a.jobs if j[1] > 0] for a in accounts}
    picks: list[uuid.UUID] = []
    for _ in range(slots):
        waiting = [a for a in accounts if queues[a.account_id]]
        if not waiting:
            break
        chosen = min(waiting, key=lambda a: (passes[a.account_id], a.in_flight_items, a.account_id))
        job = queues[chosen.account_id][0]
        picks.append(job[0])
        clock = max(clock, passes[chosen.account_id])
        passes[chosen.account_id] += job[2] / chosen.weight
        chosen.in_flight_items += job[2]
        job[1] -= 1
        if job[1] == 0:
            queues[chosen.account_id].pop(0)
    return Allocation(picks, start, clock)


def window(settings: Settings, lane: str, workers: int) -> int:
    """Chunks a lane keeps in flight: `window_per_worker` per worker process serving it,
    at least `min_window` (so that a lane with no worker yet shows waiting work, which
    starts gpu workers), at most the lane's limit."""
    wanted = max(settings.min_window, settings.window_per_worker * workers)
    return min(wanted, settings.lane_limit(lane))


def serving(workers: list[Any], lane: str) -> int:
    """Worker processes that run some stage of the lane's chunks: the cpu lane's on cpu
    workers; the gpu lane's model stage on gpu workers, its pre- and post-processing on
    cpu workers."""
    queues = {"cpu": ("cpu",), "gpu": ("gpu", "cpu")}[lane]
    return sum(any(q in w.queues for q in queues) for w in workers)


# --- reading a lane ------------------------------------------------------------------


def _in_flight(session: Session, lane: str) -> dict[int, tuple[int, int]]:
    """Per account: (chunks, items) in flight on the lane."""
    items = func.sum(Chunk.stop - Chunk.start)
    rows = session.execute(
        select(Job.account_id, func.count(), items)
        .join(Job, Job.id == Chunk.job_id)
        .where(Chunk.queue == lane, Chunk.state.in_(IN_FLIGHT))
        .group_by(Job.account_id)
    ).all()
    return {account: (n, int(total or 0)) for account, n, total in rows}


def _waiting(session: Session, lane: str) -> list[Any]:
    """The lane's jobs with held chunks: (job id, account, created, chunk size, status,
    held chunks, held items), oldest first."""
    held = (
        select(
            Chunk.job_id,
            func.count().label("n"),
            func.sum(Chunk.stop - Chunk.start).label("held_items"),
        )
        .where(Chunk.queue == lane, Chunk.state == "held")
        .group_by(Chunk.job_id)
        .subquery()
    )
    return list(
        session.execute(
            select(
                Job.id,
                Job.account_id,
                Job.created_at,
                Job.chunk_size,
                Job.status,
                held.c.n,
                held.c.held_items,
            )
            .join(held, held.c.job_id == Job.id)
            .order_by(Job.created_at, Job.id)
        ).all()
    )


def _standings(
    session: Session, settings: Settings, lane: str, account_ids: set[int]
) -> dict[int, Standing]:
    """Each account's weight and stored pass on the lane."""
    if not account_ids:
        return {}
    rows = session.execute(
        select(Account.id, Account.name, Account.type, Account.share_weight, LaneShare.pass_)
        .outerjoin(LaneShare, (LaneShare.account_id == Account.id) & (LaneShare.lane == lane))
        .where(Account.id.in_(account_ids))
    ).all()
    return {
        aid: Standing(
            aid,
            weight_in_effect(kind, own, settings)[0],
            float(passed or 0.0),
            name=name,
            type=kind,
        )
        for aid, name, kind, own, passed in rows
    }


def _serving(session: Session, settings: Settings, lane: str) -> int:
    """Worker processes beating now that serve some stage of the lane (see `serving`)."""
    since = utcnow() - timedelta(seconds=settings.worker_dead_after)
    queues = session.scalars(
        select(Worker.queues).where(Worker.stopped_at.is_(None), Worker.last_seen_at >= since)
    ).all()
    return serving([SimpleNamespace(queues=q) for q in queues], lane)


def waiting_items(session: Session, lane: str) -> int:
    """Items waiting for a slot on the lane (held chunks): what the hold limit bounds."""
    return int(
        session.scalar(
            select(func.coalesce(func.sum(Chunk.stop - Chunk.start), 0)).where(
                Chunk.queue == lane, Chunk.state == "held"
            )
        )
        or 0
    )


# --- what a lane shows ------------------------------------------------------------------


@dataclass
class Share:
    """One account's part of a lane now."""

    account_id: int
    name: str
    type: str
    weight: float
    in_flight_items: int
    waiting_items: int
    share: float  # its weight over the weights of every account with work on the lane


@dataclass
class LaneBoard:
    """A lane's fair share as it stands: who has work there, and how fast it moves."""

    lane: str
    window: int
    in_flight_chunks: int
    accounts: list[Share]
    items_per_second: float | None  # the lane's recent throughput; None: nothing ended lately

    @property
    def in_flight_items(self) -> int:
        return sum(a.in_flight_items for a in self.accounts)

    @property
    def waiting_items(self) -> int:
        return sum(a.waiting_items for a in self.accounts)

    def by_type(self) -> dict[str, dict[str, float]]:
        """Per account type: items in flight and waiting, and the type's share of the lane."""
        types: dict[str, dict[str, float]] = {}
        for a in self.accounts:
            row = types.setdefault(a.type, {"in_flight_items": 0, "waiting_items": 0, "share": 0.0})
            row["in_flight_items"] += a.in_flight_items
            row["waiting_items"] += a.waiting_items
            row["share"] += a.share
        return types

    def of(self, account_id: int) -> Share | None:
        return next((a for a in self.accounts if a.account_id == account_id), None)


def recent_rate(session: Session, lane: str) -> float | None:
    """Items per second the lane finished over its chunks of the last few minutes."""
    since = utcnow() - RATE_WINDOW
    items, first, last = session.execute(
        select(
            func.sum(Chunk.stop - Chunk.start),
            func.min(Chunk.started_at),
            func.max(Chunk.finished_at),
        ).where(Chunk.queue == lane, Chunk.state == "done", Chunk.finished_at >= since)
    ).one()
    first, last = common.aware(first), common.aware(last)
    if not items or first is None or last is None or last <= first:
        return None
    return items / (last - first).total_seconds()


def lane_board(
    session: Session, settings: Settings, lane: str, rows: list[Any] | None = None
) -> LaneBoard:
    """The lane's window, and each account with work on it: in flight, waiting, share.
    `rows`: the lane's waiting jobs (`_waiting`), when the caller has read them already."""
    flying = _in_flight(session, lane)
    waiting: dict[int, int] = defaultdict(int)
    for row in _waiting(session, lane) if rows is None else rows:
        if row.status in SERVED_JOB_STATUSES:
            waiting[row.account_id] += int(row.held_items or 0)
    ids = set(flying) | set(waiting)
    standings = _standings(session, settings, lane, ids)
    total_weight = sum(standings[a].weight for a in ids) or 1.0
    accounts = [
        Share(
            account_id=a,
            name=standings[a].name,
            type=standings[a].type,
            weight=standings[a].weight,
            in_flight_items=flying.get(a, (0, 0))[1],
            waiting_items=waiting.get(a, 0),
            share=standings[a].weight / total_weight,
        )
        for a in sorted(ids)
    ]
    return LaneBoard(
        lane=lane,
        window=window(settings, lane, _serving(session, settings, lane)),
        in_flight_chunks=sum(n for n, _ in flying.values()),
        accounts=accounts,
        items_per_second=recent_rate(session, lane),
    )


def job_place(session: Session, settings: Settings, job: Job) -> dict[str, Any] | None:
    """Where a job with chunks still waiting stands on its lane: its waiting chunks, the
    chunks ahead of its next one (the lane's in flight, and its account's older jobs'
    waiting ones), its account's share, and estimates of its start (None once started)
    and end from the lane's recent throughput. None when none of its chunks waits."""
    mine = session.execute(
        select(func.count(), func.coalesce(func.sum(Chunk.stop - Chunk.start), 0)).where(
            Chunk.job_id == job.id, Chunk.state == "held"
        )
    ).one()
    if not mine[0] or job.status not in SERVED_JOB_STATUSES:
        return None
    rows = _waiting(session, job.lane)
    board = lane_board(session, settings, job.lane, rows)
    older = [
        row
        for row in rows
        if row.account_id == job.account_id
        and (row.created_at, str(row.id)) < (job.created_at, str(job.id))
    ]
    own_ahead_items = sum(int(r.held_items or 0) for r in older)
    share = board.of(job.account_id)
    fraction = share.share if share else 1.0
    rate = board.items_per_second
    now = utcnow()
    start = end = None
    if rate:
        account_rate = rate * fraction
        begins = board.in_flight_items / rate + own_ahead_items / account_rate
        open_items = job.total_items - job.succeeded_items - job.failed_items
        start = None if job.started_at else now + timedelta(seconds=begins)
        end = now + timedelta(seconds=begins + open_items / account_rate)
    return {
        "waiting_chunks": int(mine[0]),
        "waiting_items": int(mine[1]),
        "chunks_ahead": board.in_flight_chunks + sum(int(r.n) for r in older),
        "share": round(fraction, 4),
        "lane_items_per_second": round(rate, 1) if rate else None,
        "estimated_start": start.isoformat() if start else None,
        "estimated_end": end.isoformat() if end else None,
    }


# --- refilling a lane ------------------------------------------------------------------


def _lock_lane(session: Session, lane: str) -> None:
    if session.connection().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LANE_LOCK[lane]})


# Written at every refill: plain statements, compiled once, on Postgres and SQLite alike.
STORE_PASS = text(
    'INSERT INTO lane_shares (lane, account_id, "pass") VALUES (:lane, :account, :pass) '
    'ON CONFLICT (lane, account_id) DO UPDATE SET "pass" = excluded."pass"'
)
STORE_CLOCK = text(
    "INSERT INTO lane_clocks (lane, clock) VALUES (:lane, :clock) "
    "ON CONFLICT (lane) DO UPDATE SET clock = excluded.clock"
)


def _clock(session: Session, lane: str) -> float:
    return float(session.scalar(select(LaneClock.clock).where(LaneClock.lane == lane)) or 0.0)


def refill(settings: Settings, lane: str) -> int:
    """Give the lane's free slots to waiting chunks by fair share; send them after the
    commit. Returns how many were given."""
    with session_scope(settings) as session:
        _lock_lane(session, lane)
        flying = _in_flight(session, lane)
        free = window(settings, lane, _serving(session, settings, lane)) - sum(
            n for n, _ in flying.values()
        )
        if free <= 0:
            return 0
        jobs = [row for row in _waiting(session, lane) if row.status in SERVED_JOB_STATUSES]
        if not jobs:
            return 0
        accounts = _standings(
            session, settings, lane, {row.account_id for row in jobs} | set(flying)
        )
        for aid, (_, items) in flying.items():
            accounts[aid].in_flight_items = items
        for row in jobs:
            accounts[row.account_id].jobs.append([row.id, row.n, row.chunk_size])
        given_out = allocate(list(accounts.values()), free, _clock(session, lane))
        wanted: dict[uuid.UUID, int] = defaultdict(int)
        for job_id in given_out.picks:
            wanted[job_id] += 1
        owner = {row.id: row.account_id for row in jobs}
        given: dict[int, int] = defaultdict(int)
        now = utcnow()
        released = {job_id: chunks.release(session, job_id, n, now) for job_id, n in wanted.items()}
        refs: list[tuple[ChunkRef, str]] = []
        for job_id in given_out.picks:  # sent in the order given: the broker keeps it
            if released[job_id]:
                chunk = released[job_id].pop(0)
                given[owner[job_id]] += chunk_items(chunk)
                refs.append((ChunkRef(chunk.id, chunk.task_id, chunk.stage), lane))
        start = given_out.start
        passes = [
            {"lane": lane, "account": a, "pass": start[a] + items / accounts[a].weight}
            for a, items in sorted(given.items())
        ]
        if passes:
            session.execute(STORE_PASS, passes)
            session.execute(STORE_CLOCK, {"lane": lane, "clock": given_out.clock})
        after_commit(session, lambda: send_chunks(refs))
    return len(refs)


def refill_all(settings: Settings) -> dict[str, int]:
    """Every lane topped up: the reconciler's round, and a safety net for any refill that
    a process did not live to make."""
    return {lane: refill(settings, lane) for lane in LANES}


def safe_refill(settings: Settings, lane: str) -> None:
    """A refill after an event (a job stored, a chunk ended) that must not fail the event:
    should Postgres or the broker be away, the reconciler's next round refills."""
    try:
        refill(settings, lane)
    except Exception as exc:  # noqa: BLE001 - the work is stored; the reconciler sends it
        log.warning("the %s lane was not refilled (%s); the reconciler will", lane, exc)
