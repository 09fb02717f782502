"""SQLAlchemy 2 models. Postgres (or SQLite on the embedded default) is the source of truth."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from laneway.settings import ACCOUNT_TYPES, LANES

JOB_STATUSES = ("queued", "running", "succeeded", "partial", "failed", "cancelled")
FINAL_JOB_STATUSES = ("succeeded", "partial", "failed", "cancelled")
CHUNK_STATES = ("queued", "running", "done", "failed", "cancelled")

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
    type_annotation_map = {dict[str, Any]: JSON, list[str]: JSON}


class Account(Base):
    __tablename__ = "accounts"
    __table_args__ = (CheckConstraint(_in("type", ACCOUNT_TYPES), name="type"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    type: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[CreatedAt]

    keys: Mapped[list[ApiKey]] = relationship(back_populates="account")


class ApiKey(Base):
    """An API key: only its SHA-256 is stored; the prefix finds it without revealing it."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64))
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
    chunk_size: Mapped[int] = mapped_column(Integer)
    label_counts: Mapped[dict[str, Any] | None]
    pre_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    model_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    post_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[dict[str, Any] | None]
    created_at: Mapped[CreatedAt]
    started_at: Mapped[Timestamp]
    finished_at: Mapped[Timestamp]

    account: Mapped[Account] = relationship()


class JobItem(Base):
    """One input text, written in bulk (COPY on Postgres) when the job is created.

    `idx` is the item's place in the input; `pos` its place in length order. Chunks cover
    ranges of `pos`, so each chunk holds texts of similar length and pads little.
    """

    __tablename__ = "job_items"
    __table_args__ = (UniqueConstraint("job_id", "pos"),)

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    pos: Mapped[int] = mapped_column(Integer)
    item_id: Mapped[str] = mapped_column(String(200))
    text: Mapped[str] = mapped_column(Text)


class Chunk(Base):
    __tablename__ = "chunks"
    __table_args__ = (
        UniqueConstraint("job_id", "seq"),
        CheckConstraint(_in("state", CHUNK_STATES), name="state"),
        Index("ix_chunks_state", "state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    # A half-open range of item positions in length order (JobItem.pos).
    start: Mapped[int] = mapped_column(Integer)
    stop: Mapped[int] = mapped_column(Integer)
    queue: Mapped[str] = mapped_column(String(20))
    task_id: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(20), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(200))
    device: Mapped[str | None] = mapped_column(String(20))
    # Seconds per stage: CPU pre-processing, the model on the device, CPU post-processing.
    pre_seconds: Mapped[float | None] = mapped_column(Float)
    model_seconds: Mapped[float | None] = mapped_column(Float)
    post_seconds: Mapped[float | None] = mapped_column(Float)
    queued_at: Mapped[CreatedAt]
    started_at: Mapped[Timestamp]
    finished_at: Mapped[Timestamp]


class Result(Base):
    """One item's output, upserted by (job, item index): redelivery never duplicates it."""

    __tablename__ = "results"

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    item_id: Mapped[str] = mapped_column(String(200))
    label: Mapped[str | None] = mapped_column(String(200))
    output: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[CreatedAt]
