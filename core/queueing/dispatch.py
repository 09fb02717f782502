"""Send chunks to their lane: each chunk's task (the cpu lane) or chain of stage tasks (the
gpu lane). Which chunks, and when, is fair share's choice (jobs/fairshare.py); a job is
finalized by its last chunk's settle, or by the reconciler, so no chord counts chunks.

Tasks are named, not imported: a web process sends chunks without importing torch. They go
through the Celery app the process's entry room built (core.queueing.celery_app.sending_app).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import redis
from celery import chain, signature

from core.config.settings import Settings, get_settings
from core.queueing.celery_app import app_settings, chunk_time_limits, sending_app
from core.queueing.result_backend import fire_and_forget
from core.store.redis_conn import redis_client

log = logging.getLogger(__name__)

GPU_STAGES = ("prep", "model", "post")
STAGE_QUEUE = {"run": "cpu", "prep": "cpu", "model": "gpu", "post": "cpu"}


def stage_task_id(chunk_task_id: str, stage: str) -> str:
    """The broker task id of one stage of a chunk. The stage that holds the lane's worker
    (`run`, `model`) carries the chunk's own task id; the others add a suffix, so the
    reconciler can tell every message of a chunk apart from other chunks'."""
    return chunk_task_id if stage in ("run", "model") else f"{chunk_task_id}-{stage}"


def chunk_task_ids(chunk_task_id: str, lane: str) -> list[str]:
    return [task_id for task_id, _ in chunk_messages(chunk_task_id, lane)]


def chunk_messages(chunk_task_id: str, lane: str) -> list[tuple[str, str]]:
    """Each message a chunk may have in the broker: its task id and the queue it goes to."""
    stages = ("run",) if lane == "cpu" else GPU_STAGES
    return [(stage_task_id(chunk_task_id, s), STAGE_QUEUE[s]) for s in stages]


def chunk_signature(chunk: Any, lane: str, settings: Settings | None = None, app: Any = None):  # noqa: ANN201
    """The cpu lane runs a chunk in one task; the gpu lane keeps only the model stage on
    the gpu queue, with pre- and post-processing on cpu workers around it, starting from
    the chunk's current stage. Each task gets its lane's soft and hard time limits."""
    settings = settings or get_settings()
    limits = chunk_time_limits(settings.chunk_timeout_for(lane))
    if lane == "cpu":
        stages: Sequence[str] = ("run",)
    else:
        current = chunk.stage if chunk.stage in GPU_STAGES else "prep"
        stages = GPU_STAGES[GPU_STAGES.index(current) :]
    sigs = [
        signature(
            f"laneway.{stage}_chunk",
            app=app,
            args=(chunk.id,),
            immutable=True,
            queue=STAGE_QUEUE[stage],
            task_id=stage_task_id(chunk.task_id, stage),
            **limits,
        )
        for stage in stages
    ]
    return sigs[0] if len(sigs) == 1 else chain(*sigs, app=app)


# The chunks whose send failed after their transition committed (the broker away): a set
# of chunk ids in Redis, which the reconciler's next pass sends again without waiting out
# the grace it gives a message that may still be on its way (tasks/maintenance.py).
UNSENT_KEY = "laneway:unsent-chunks"


def send_chunks(chunks: Sequence[tuple[Any, str]]) -> None:
    """Send (chunk, lane) pairs: slots given by fair share, the reconciler's re-sends,
    split halves. Should a send fail, it and those after it are noted as unsent and the
    error goes on to the caller."""
    app = sending_app()
    settings = app_settings()
    sent = 0
    try:
        with fire_and_forget():
            for chunk, lane in chunks:
                chunk_signature(chunk, lane, settings, app).apply_async()
                sent += 1
    except Exception:
        note_unsent(settings, [chunk.id for chunk, _ in chunks[sent:]])
        raise


def note_unsent(settings: Settings, chunk_ids: Sequence[int]) -> None:
    """Remember chunks whose send failed, for the reconciler. Best effort: with Redis away
    too (the broker on Redis), the reconciler still finds them after its grace."""
    _change_unsent(settings, "sadd", chunk_ids, "chunks %s were neither sent nor noted (%s)")


def unsent_chunks(settings: Settings) -> set[int]:
    """The chunk ids noted as unsent (none when Redis does not answer)."""
    try:
        return {int(i) for i in redis_client(settings).smembers(UNSENT_KEY)}
    except redis.RedisError:
        return set()


def forget_unsent(settings: Settings, chunk_ids: Sequence[int]) -> None:
    """Drop chunks from the unsent set. Best effort: a chunk left there is only sent once
    more, which a chunk survives."""
    _change_unsent(settings, "srem", chunk_ids, "the unsent chunks %s stay noted (%s)")


def _change_unsent(settings: Settings, command: str, chunk_ids: Sequence[int], failed: str) -> None:
    if not chunk_ids:
        return
    try:
        getattr(redis_client(settings), command)(UNSENT_KEY, *chunk_ids)
    except redis.RedisError as exc:
        log.warning(failed, list(chunk_ids), exc)
