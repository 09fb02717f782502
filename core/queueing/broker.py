"""What the broker holds: each lane's depth and the ids of the tasks it still carries.

`depths` and `broker_snapshot` read whichever broker settings.broker names; the rest of
this module reads Redis's internals, and `rabbitmq_ready` RabbitMQ's.

Redis:

Kombu's Redis transport keeps a queue's waiting messages in lists (one per priority step)
and every delivered but unacknowledged message (prefetched, reserved or running: Laneway
acks late) in the `unacked` hash, with its delivery time in `unacked_index`. A bare list
length misses the second part, so depth counts both. An interactive queue's depth also
counts the requests waiting on its lane's request list (core/store/interactive_protocol.py).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import amqp.exceptions
import kombu.exceptions
import redis
from kombu import Connection

from core.config.settings import Settings
from core.queueing.celery_app import QUEUES
from core.store.interactive_protocol import requests_key
from core.store.redis_conn import redis_client
from core.vocab import INTERACTIVE_PREFIX

# kombu.transport.redis: Channel.sep, PRIORITY_STEPS, unacked_key, unacked_index_key.
PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
PAGE = 500


def queue_keys(queue: str) -> list[str]:
    """The Redis lists behind one queue, one per priority step."""
    return [queue if p == 0 else f"{queue}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS]


def _task_id(message: Any) -> str | None:
    try:
        return message["headers"]["id"]
    except (KeyError, TypeError):
        return None


def _loads(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def lane_depths(r: redis.Redis, queues: Iterable[str]) -> dict[str, dict[str, int]]:
    """Per queue: messages waiting in it, delivered to workers from it, and both together.
    One round trip, and `unacked` (every delivered message of every queue) read once."""
    queues = list(queues)
    with r.pipeline(transaction=False) as pipe:
        for queue in queues:
            for key in queue_keys(queue):
                pipe.llen(key)
            if queue.startswith(INTERACTIVE_PREFIX):
                # Requests travel on their own list, not as Celery messages.
                pipe.llen(requests_key(queue.removeprefix(INTERACTIVE_PREFIX)))
        pipe.hvals(UNACKED)
        *replies, unacked = pipe.execute()
    delivered: Counter[str] = Counter()
    for raw in unacked:
        entry = _loads(raw)
        if isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], str):
            delivered[entry[2]] += 1
    lengths = iter(replies)
    depths = {}
    for queue in queues:
        keys = len(queue_keys(queue)) + queue.startswith(INTERACTIVE_PREFIX)
        queued = sum(next(lengths) for _ in range(keys))
        depths[queue] = {
            "queued": queued,
            "delivered": delivered[queue],
            "depth": queued + delivered[queue],
        }
    return depths


def queue_depths(settings: Settings) -> dict[str, dict[str, int]]:
    """Every Laneway queue's depth (the /lanes endpoint, the dashboard, the scrape)."""
    return depths(settings, QUEUES)


def lane_depth(r: redis.Redis, queue: str) -> dict[str, int]:
    """Messages waiting in `queue`, delivered to workers from it, and both together."""
    return lane_depths(r, [queue])[queue]


@dataclass
class Snapshot:
    """Task ids in the broker: waiting in a queue, or delivered (with delivery time).

    RabbitMQ shows no message without consuming it: there, `busy` names the queues holding
    any ready message, and a task counts as held while its queue is busy (the reconciler,
    tasks/maintenance.py, says why that is enough)."""

    waiting: set[str] = field(default_factory=set)
    delivered: dict[str, float] = field(default_factory=dict)
    busy: set[str] | None = None

    def holds(self, task_id: str, delivered_after: float = 0.0, queue: str = "") -> bool:
        """True when the task waits in a queue, or was delivered after `delivered_after`."""
        if self.busy is not None:
            return queue in self.busy
        if task_id in self.waiting:
            return True
        at = self.delivered.get(task_id)
        return at is not None and at >= delivered_after


def snapshot(r: redis.Redis, queues: Iterable[str]) -> Snapshot:
    """Every task id waiting in `queues` or delivered and not yet acknowledged."""
    snap = Snapshot()
    for queue in queues:
        for key in queue_keys(queue):
            start = 0
            while True:
                page = r.lrange(key, start, start + PAGE - 1)
                snap.waiting.update(i for raw in page if (i := _task_id(_loads(raw))))
                if len(page) < PAGE:
                    break
                start += PAGE
    when = dict(r.zrange(UNACKED_INDEX, 0, -1, withscores=True))
    for tag, raw in r.hgetall(UNACKED).items():
        entry = _loads(raw)
        task_id = _task_id(entry[0]) if isinstance(entry, list) and entry else None
        if task_id:
            snap.delivered[task_id] = when.get(tag, time.time())
    return snap


# A key with no expiry that only an emptied Redis lacks (a restart without persistence, a
# FLUSHALL or FLUSHDB): beat looks for it every few seconds (tasks/beat.py).
EPOCH_KEY = "laneway:broker:epoch"


def broker_emptied(r: redis.Redis) -> bool:
    """True when Redis lost its data since `mark_broker` last ran (or never had it)."""
    return not r.exists(EPOCH_KEY)


def mark_broker(r: redis.Redis) -> None:
    r.set(EPOCH_KEY, str(time.time()), nx=True)


# --- either broker ----------------------------------------------------------------------

# What a broker that cannot be read raises: callers fall back as they do without Redis.
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    redis.RedisError,
    kombu.exceptions.OperationalError,
    amqp.exceptions.AMQPError,
    OSError,
)
AMQP_TIMEOUT = 5  # seconds to connect to RabbitMQ before a read gives up


def rabbitmq_ready(url: str, queues: Iterable[str]) -> dict[str, int]:
    """Messages ready in each RabbitMQ queue, from a passive declare (AMQP 0-9-1's
    queue.declare-ok carries the count; no management plugin needed). Messages delivered
    to consumers and not yet acknowledged are not in it: AMQP does not report them. A
    queue nobody declared yet holds nothing. A broker that cannot be reached (refused,
    timed out, the login refused) is kombu's OperationalError, as kombu raises it when
    it sends, whatever socket or AMQP error py-amqp raised beneath."""
    ready: dict[str, int] = {}
    try:
        with Connection(url, connect_timeout=AMQP_TIMEOUT) as conn:
            channel = conn.channel()
            for queue in queues:
                try:
                    ready[queue] = channel.queue_declare(queue, passive=True).message_count
                except amqp.exceptions.NotFound:
                    ready[queue] = 0
                    channel = conn.channel()  # the broker closed the channel with its 404
    except (OSError, amqp.exceptions.AMQPError) as exc:
        raise kombu.exceptions.OperationalError(f"RabbitMQ: {exc}") from exc
    return ready


def depths(settings: Settings, queues: Iterable[str]) -> dict[str, dict[str, int]]:
    """Each queue's depth on the broker settings.broker names. On RabbitMQ `delivered` is
    0 (AMQP does not count unacknowledged messages), so depth is what waits; an
    interactive queue also counts its lane's request list in Redis."""
    queues = list(queues)
    if not settings.broker_is_rabbitmq:
        return lane_depths(redis_client(settings), queues)
    ready = rabbitmq_ready(settings.broker, queues)
    interactive = [q for q in queues if q.startswith(INTERACTIVE_PREFIX)]
    if interactive:
        r = redis_client(settings)
        for queue in interactive:
            ready[queue] += r.llen(requests_key(queue.removeprefix(INTERACTIVE_PREFIX)))
    return {q: {"queued": ready[q], "delivered": 0, "depth": ready[q]} for q in queues}


def depth(settings: Settings, queue: str) -> dict[str, int]:
    return depths(settings, [queue])[queue]


def broker_snapshot(settings: Settings, queues: Iterable[str]) -> Snapshot:
    """What the broker holds, for the reconciler: task ids on Redis, busy queues on RabbitMQ."""
    if not settings.broker_is_rabbitmq:
        return snapshot(redis_client(settings), queues)
    return Snapshot(busy={q for q, n in rabbitmq_ready(settings.broker, queues).items() if n})
