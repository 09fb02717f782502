"""SQLAlchemy 2 models. Postgres (or SQLite on the embedded default) is the source of truth."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    false,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from core.vocab import ACCOUNT_TYPES, LANES
from core.vocab import FINAL_JOB_STATUSES as FINAL_JOB_STATUSES  # shared with the metrics

# held: a status rows written before fair share may carry (a job waited whole for room);
# a job's waiting now shows in its chunks' state (held: not yet given a slot on its lane).
# cancelling: DELETE asked for it, running chunks stop at their next micro-batch.
JOB_STATUSES = (
    "held",
    "queued",
    "running",
    "cancelling",
    "succeeded",
    "partial",
    "failed",
    "cancelled",
)
# held: waiting for a slot on its lane, no message sent (jobs/fairshare.py gives slots);
# split: a chunk that kept killing its workers, replaced by two halves (its children).
CHUNK_STATES = ("held", "queued", "running", "done", "failed", "cancelled", "split")
FINISHED_CHUNK_STATES = ("done", "failed", "cancelled", "split")
OPEN_CHUNK_STATES = ("queued", "running")
# The stage a chunk runs next: `run` (cpu lane, all stages in one task) or, on the gpu
# lane, `prep` (cpu) -> `model` (gpu) -> `post` (cpu).
CHUNK_STAGES = ("run", "prep", "model", "post")
DEAD_LETTER_KINDS = ("item", "chunk")

CreatedAt = Annotated[
    datetime, mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)
]
Timestamp = Annotated[datetime | None, mapped_column(DateTime(timezone=True))]


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    type_annotation_map = {dict[str, Any]: JSON, list[str]: JSON, list[int]: JSON}


class Account(Base):
    __tablename__ = "accounts"
    __table_args__ = (CheckConstraint(_in("type", ACCOUNT_TYPES), name="type"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    type: Mapped[str] = mapped_column(String(20))
    # Admins may manage every account and key through /v1/admin; their own jobs stay theirs.
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Told when an inbox job's results reach the outbox; may carry a secret token, so it is
    # never logged.
    webhook_url: Mapped[str | None] = mapped_column(String(2000))
    # The account's weight in its lanes' fair share (jobs/fairshare.py); None: its type's
    # (LANEWAY_SHARE_WEIGHT_<TYPE>). Read at every refill: a change needs no restart.
    share_weight: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[CreatedAt]

    keys: Mapped[list[ApiKey]] = relationship(back_populates="account")


class ApiKey(Base):
    """An API key: only its SHA-256 is stored; the prefix finds it without revealing it.

    A key is live until `revoked_at`; rotation sets that moment in the future (a grace
    period) so the caller can switch to the new key without an outage.
    """

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[CreatedAt]
    revoked_at: Mapped[Timestamp]

    account: Mapped[Account] = relationship(back_populates="keys")


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(_in("status", JOB_STATUSES), name="status"),
        CheckConstraint(_in("lane", LANES), name="lane"),
        Index("ix_jobs_account_created", "account_id", "created_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    tasks: Mapped[list[str]]
    labels: Mapped[list[str]]
    status: Mapped[str] = mapped_column(String(20), default="queued")
    lane: Mapped[str] = mapped_column(String(10))
    source: Mapped[str] = mapped_column(String(20), default="api")
    total_items: Mapped[int] = mapped_column(Integer)
    succeeded_items: Mapped[int] = mapped_column(Integer, default=0)
    failed_items: Mapped[int] = mapped_column(Integer, default=0)
    cancelled_items: Mapped[int] = mapped_column(Integer, default=0)
    chunk_size: Mapped[int] = mapped_column(Integer)
    label_counts: Mapped[dict[str, Any] | None]
    pre_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    model_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    post_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[dict[str, Any] | None]
    created_at: Mapped[CreatedAt]
    started_at: Mapped[Timestamp]
    finished_at: Mapped[Timestamp]
    cancel_requested_at: Mapped[Timestamp]
    # The lane decision and what it was made from (planner.Routing.as_dict()).
    routing: Mapped[dict[str, Any] | None]

    account: Mapped[Account] = relationship()


class JobItem(Base):
    """One input text, written in bulk (through a COPY on Postgres) when the job is created.

    `idx` is the item's place in the input; `pos` its place in length order. Chunks cover
    ranges of `pos`, so each chunk holds texts of similar length and pads little. The key
    is (job, pos), the one index chunks read by: a second one on (job, idx) would slow the
    bulk write of a large job by about half as much again, and nothing reads by idx.
    """

    __tablename__ = "job_items"

    # No foreign key: its check cost every bulk-written row a lock on the job's row; a
    # trigger deletes a deleted job's items (db/migrations/versions/0014).
    job_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    pos: Mapped[int] = mapped_column(Integer, primary_key=True)
    idx: Mapped[int] = mapped_column(Integer)
    item_id: Mapped[str] = mapped_column(String(200))
    text: Mapped[str] = mapped_column(Text)


class Chunk(Base):
    __tablename__ = "chunks"
    __table_args__ = (
        UniqueConstraint("job_id", "seq"),
        CheckConstraint(_in("state", CHUNK_STATES), name="state"),
        CheckConstraint(_in("stage", CHUNK_STAGES), name="stage"),
        Index("ix_chunks_state", "state"),
        # A lane's waiting chunks by job, in order: what fair share reads at every refill.
        Index(
            "ix_chunks_held",
            "queue",
            "job_id",
            "seq",
            postgresql_where=text("state = 'held'"),
            sqlite_where=text("state = 'held'"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    # A half-open range of item positions in length order (JobItem.pos).
    start: Mapped[int] = mapped_column(Integer)
    stop: Mapped[int] = mapped_column(Integer)
    # Retry chunks (dead letters sent back) and halves of one name their items instead,
    # by position (JobItem.pos, the items' key).
    positions: Mapped[list[int] | None]
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("chunks.id", ondelete="SET NULL"))
    queue: Mapped[str] = mapped_column(String(20))
    task_id: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(20), default="queued")
    stage: Mapped[str] = mapped_column(String(10), default="run")
    # Times the lane's worker started this chunk (the run or model stage).
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(200))
    # The worker process (Worker.id) running the chunk now: its heartbeat says if it lives.
    worker_instance: Mapped[str | None] = mapped_column(String(64))
    last_error: Mapped[str | None] = mapped_column(Text)
    device: Mapped[str | None] = mapped_column(String(20))
    # The model stage's number format ("bf16"; "bf16+fp32" where its models differ) and
    # runtime ("torch 2.13.0 bf16 cpu"), as inference/precision.py chose and checked them.
    precision: Mapped[str | None] = mapped_column(String(20))
    runtime: Mapped[str | None] = mapped_column(String(100))
    # Seconds per stage: CPU pre-processing, the model on the device, CPU post-processing.
    pre_seconds: Mapped[float | None] = mapped_column(Float)
    model_seconds: Mapped[float | None] = mapped_column(Float)
    post_seconds: Mapped[float | None] = mapped_column(Float)
    # The cores the worker that ran the model held (its torch threads; None: one, as rows
    # written before were priced): its CPU seconds are priced per core.
    cpu_cores: Mapped[int | None] = mapped_column(Integer)
    queued_at: Mapped[CreatedAt]
    started_at: Mapped[Timestamp]
    finished_at: Mapped[Timestamp]


class LaneShare(Base):
    """An account's pass on a lane: the items the lane gave it, each divided by the
    account's weight then (start-time fair queuing, jobs/fairshare.py). The account with
    the lowest pass among those waiting gets the lane's next free slot."""

    __tablename__ = "lane_shares"
    __table_args__ = (CheckConstraint(_in("lane", LANES), name="lane"),)

    lane: Mapped[str] = mapped_column(String(10), primary_key=True)
    account_id: Mapped[int] = mapped_column(
        ForeignKey("accounts.id", ondelete="CASCADE"), primary_key=True
    )
    pass_: Mapped[float] = mapped_column("pass", Float, default=0.0)


class LaneClock(Base):
    """A lane's fair-share clock: the pass at which its last given chunk started. An
    account whose pass is behind it (new, or back from idle) starts from it."""

    __tablename__ = "lane_clocks"
    __table_args__ = (CheckConstraint(_in("lane", LANES), name="lane"),)

    lane: Mapped[str] = mapped_column(String(10), primary_key=True)
    clock: Mapped[float] = mapped_column(Float, default=0.0)


class Result(Base):
    """One item's output, upserted by (job, item index): redelivery never duplicates it."""

    __tablename__ = "results"

    # As job_items': no foreign key, a trigger deletes a deleted job's results.
    job_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    item_id: Mapped[str] = mapped_column(String(200))
    label: Mapped[str | None] = mapped_column(String(200))
    output: Mapped[dict[str, Any] | None]
    # An embedding as float32 bytes (core/util/vectors.py), kept out of `output`'s JSON.
    vector: Mapped[bytes | None] = mapped_column(LargeBinary)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[CreatedAt]


class DeadLetter(Base):
    """Work that failed for good: one poison item, or a whole chunk that failed as a unit.

    `idxs` names the items (JobItem.idx) it covers, so sending it back re-runs exactly them.
    """

    __tablename__ = "dead_letters"
    __table_args__ = (
        CheckConstraint(_in("kind", DEAD_LETTER_KINDS), name="kind"),
        Index("ix_dead_letters_job_id", "job_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    chunk_id: Mapped[int | None] = mapped_column(ForeignKey("chunks.id", ondelete="SET NULL"))
    kind: Mapped[str] = mapped_column(String(10))
    idxs: Mapped[list[int]]
    item_ids: Mapped[list[str]]
    error: Mapped[str] = mapped_column(Text)
    traceback: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[CreatedAt]
    # Set when the letter is sent back (POST /v1/jobs/<id>/retry, `laneway dlq retry`).
    retried_at: Mapped[Timestamp]
    retry_chunk_id: Mapped[int | None] = mapped_column(ForeignKey("chunks.id", ondelete="SET NULL"))


class Worker(Base):
    """One worker process (a `celery worker` parent) from start to stop, with heartbeats."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(200))
    queues: Mapped[list[str]]
    device: Mapped[str | None] = mapped_column(String(20))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[CreatedAt]
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    stopped_at: Mapped[Timestamp]
    stop_reason: Mapped[str | None] = mapped_column(String(200))
    # The CUDA device the process was pinned to (its CUDA_VISIBLE_DEVICES), if any.
    gpu_device: Mapped[str | None] = mapped_column(String(20))
    start_reason: Mapped[str | None] = mapped_column(String(200))
    # Chunk tasks running now (an interactive worker: requests in flight, as of its last
    # heartbeat); idle since the last one ended (beat's scale-down reads it), busy since
    # the first of those running began.
    running_tasks: Mapped[int] = mapped_column(Integer, default=0)
    idle_since: Mapped[Timestamp]
    busy_since: Mapped[Timestamp]
    # A scale-up: since when work waited for this worker, when it finished its first task.
    waiting_since: Mapped[Timestamp]
    first_task_at: Mapped[Timestamp]
    cold_start_seconds: Mapped[float | None] = mapped_column(Float)


class WorkerEvent(Base):
    """A worker's start (and why), exit, scale-down, and idle periods of a second or more."""

    __tablename__ = "worker_events"
    __table_args__ = (Index("ix_worker_events_worker_id", "worker_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    # Worker.id; no foreign key: the fleet records a start before the worker registers.
    worker_id: Mapped[str] = mapped_column(String(64))
    hostname: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str | None] = mapped_column(String(200))
    detail: Mapped[dict[str, Any] | None]
    created_at: Mapped[CreatedAt]


class JobEvent(Base):
    """What happened to a job, once each: finalized, cancelled, held, released, retried."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id", "job_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(30))
    detail: Mapped[dict[str, Any] | None]
    created_at: Mapped[CreatedAt]


class InboxFile(Base):
    """A file taken from the inbox. Its content's SHA-256 is unique per account, so the same
    content is never ingested twice, even by two scans at once; `stem` names its outbox
    files."""

    __tablename__ = "inbox_files"
    __table_args__ = (
        UniqueConstraint("account_id", "sha256", name="uq_inbox_files_account_id_sha256"),
        UniqueConstraint("account_id", "stem", name="uq_inbox_files_account_id_stem"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    sha256: Mapped[str] = mapped_column(String(64))
    # Set in the transaction that claims the hash, once the job exists.
    job_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), unique=True
    )
    name: Mapped[str] = mapped_column(String(255))
    stem: Mapped[str] = mapped_column(String(255))
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[CreatedAt]
    outbox_sent_at: Mapped[Timestamp]
    outbox_written_at: Mapped[Timestamp]
    notified_at: Mapped[Timestamp]


class IdempotencyKey(Base):
    """A submission's `Idempotency-Key`, per account: the same key and body sent again (a
    retry whose answer was lost) returns `job_id` instead of storing a second job. The row
    is written before the job (job_id empty while it is being stored), so two requests
    racing with one key never both store; it expires after `expires_at`."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (Index("ix_idempotency_keys_expires_at", "expires_at"),)

    account_id: Mapped[int] = mapped_column(
        ForeignKey("accounts.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    # SHA-256 of the request's body: the same key with another body is a client's mistake.
    body_sha256: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    created_at: Mapped[CreatedAt]
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
