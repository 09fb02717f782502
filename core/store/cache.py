"""The result cache: identical inputs are computed once.

A task's output for a text is kept in Redis under a hash of (model, task, parameters,
text) for LANEWAY_CACHE_TTL seconds (0: no cache). The model part names the registry entry
and what shapes its output (path, max length); the parameters are the labels for zero-shot
classify and the anchors for zero-shot score. Interactive batches and batch chunks share
it, and identical texts inside one batch are computed once whether the cache is on or not.

The cache is per account: the account joins the hash, so no account can learn (from a
`cached` flag, a quick 200 instead of a 202, or anything else) that another one sent the
same text. LANEWAY_CACHE_SHARED=true shares it fleet-wide, for an operator whose accounts
trust each other. A cache without a scope (`scoped` not called) reads and stores nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis

from core.config.settings import Settings
from core.store.redis_conn import redis_client, round_trip
from core.util import vectors
from core.util.jsoncodec import dumps, dumps_bytes

log = logging.getLogger(__name__)
PREFIX = "laneway:cache:"
# The fields of the output each task writes (they never collide between tasks).
TASK_FIELDS = {
    "classify": ("label", "score", "scores"),
    "score": ("rating",),
    "extract": ("entities",),
    "embed": ("embedding", "tokens"),
}


def cache_scope(settings: Settings, account_id: object) -> str:
    """Whose entries a caller may read and fill: its account's, or everyone's when shared."""
    return "shared" if settings.cache_shared else f"account:{account_id}"


def task_identity(settings: Settings, task: str, labels: Sequence[str], scope: str = "") -> str:
    """What, besides the text, decides a task's output (the model and the parameters), and
    whose cache entry it is."""
    spec = settings.model_for(task)
    model = None if spec is None else [spec.name, spec.kind, spec.path, spec.max_length]
    # The fields join the key: an entry written before a task's output grew a field (embed's
    # `tokens`) is never read back as a whole output.
    params: dict[str, Any] = {"max_length": settings.max_length, "fields": TASK_FIELDS[task]}
    if task == "classify":
        params["labels"] = list(labels)
    elif task == "score":
        params["anchors"] = list(settings.score_anchors)
    return json.dumps([model, task, params, scope], separators=(",", ":"))


def cache_key(identity: str, text: str) -> str:
    return keyed(identity)(text)


def keyed(identity: str) -> Callable[[str], str]:
    """`cache_key` for one identity and many texts: the identity is hashed once."""
    seed = hashlib.sha256(identity.encode())
    seed.update(b"\x00")

    def key(text: str) -> str:
        digest = seed.copy()
        digest.update(text.encode("utf-8", "surrogatepass"))
        return PREFIX + digest.hexdigest()

    return key


def unique(texts: Sequence[str]) -> tuple[list[str], list[int]]:
    """The distinct texts in first-seen order, and for each text its place among them."""
    places: dict[str, int] = {}
    index = [places.setdefault(t, len(places)) for t in texts]
    return list(places), index


# Between an entry's JSON and its vector's float32 bytes: never in compact JSON text,
# whose control characters are escaped.
VECTOR_AFTER = b"\x00"


def entry(fields: dict[str, Any]) -> bytes:
    """A task's cached output: JSON, then its vector (if any) as float32 bytes
    (core/util/vectors.py), not as JSON numbers."""
    rest, packed = vectors.split(fields)
    text = dumps_bytes(rest)
    return text if packed is None else text + VECTOR_AFTER + packed


def read_entry(data: bytes) -> dict[str, Any]:
    """What `entry` stored (an entry of JSON alone, written before vectors were bytes,
    reads as it was written)."""
    text, after, packed = data.partition(VECTOR_AFTER)
    fields = json.loads(text)
    if after:
        fields[vectors.FIELD] = vectors.unpack(packed)
    return fields


class ResultCache:
    """Per task, outputs by text in Redis; a Redis error is a miss, never a failure."""

    def __init__(self, r: redis.Redis | None, settings: Settings, scope: str | None = None) -> None:
        # Unscoped, it is off: an entry must always belong to someone.
        self.redis = r if settings.cache_ttl > 0 and scope else None
        self.ttl = settings.cache_ttl
        self.settings = settings
        self.scope = scope
        self._client = r

    def scoped(self, account_id: object) -> ResultCache:
        """This cache as `account_id` may use it (cache_scope); None: off."""
        if account_id is None:
            return ResultCache(None, self.settings)
        return ResultCache(self._client, self.settings, cache_scope(self.settings, account_id))

    @property
    def enabled(self) -> bool:
        return self.redis is not None

    def _keys(self, tasks: Sequence[str], labels: Sequence[str], texts: Sequence[str]):
        keys = [keyed(task_identity(self.settings, t, labels, self.scope or "")) for t in tasks]
        return [[key(text) for key in keys] for text in texts]

    def get(
        self, tasks: Sequence[str], labels: Sequence[str], texts: Sequence[str]
    ) -> list[dict[str, Any] | None]:
        """Per text, its whole output when every task's part is cached, else None."""
        if self.redis is None or not texts:
            return [None] * len(texts)
        keys = self._keys(tasks, labels, texts)
        try:
            # On the thread's own connection: the web app reads it on each request.
            (found,) = round_trip(self.redis, [("MGET", *(k for row in keys for k in row))])
        except redis.RedisError as exc:
            log.warning("result cache unavailable: %s", type(exc).__name__)
            return [None] * len(texts)
        outputs: list[dict[str, Any] | None] = []
        per = len(tasks)
        for n in range(len(texts)):
            parts = found[n * per : (n + 1) * per]
            if any(p is None for p in parts):
                outputs.append(None)
                continue
            merged: dict[str, Any] = {}
            for part in parts:
                merged.update(read_entry(part))
            outputs.append(merged)
        return outputs

    def put(
        self,
        tasks: Sequence[str],
        labels: Sequence[str],
        texts: Sequence[str],
        outputs: Sequence[dict[str, Any] | None],
    ) -> None:
        commands = self.put_commands(tasks, labels, texts, outputs)
        if not commands:
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            for command in commands:
                # execute_command: `set`'s checks of its optional arguments cost more
                # than packing the command.
                pipe.execute_command(*command)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("result cache unavailable: %s", type(exc).__name__)

    def put_commands(
        self,
        tasks: Sequence[str],
        labels: Sequence[str],
        texts: Sequence[str],
        outputs: Sequence[dict[str, Any] | None],
    ) -> list[tuple[Any, ...]]:
        """The commands that store the texts' outputs (none when the cache is off)."""
        if self.redis is None or not texts:
            return []
        commands: list[tuple[Any, ...]] = []
        for row, out in zip(self._keys(tasks, labels, texts), outputs, strict=True):
            if not isinstance(out, dict):  # a failure is never cached
                continue
            for task, key in zip(tasks, row, strict=True):
                value = entry({f: out[f] for f in TASK_FIELDS[task] if f in out})
                commands.append(("SET", key, value, "EX", self.ttl))
        return commands


_process_caches: dict[int, ResultCache] = {}


def process_cache(settings: Settings) -> ResultCache:
    """This process's result cache for `settings`, its Redis client made once (the batch
    chunks' and the interactive worker's)."""
    if id(settings) not in _process_caches:
        _process_caches[id(settings)] = ResultCache(redis_client(settings), settings)
    return _process_caches[id(settings)]


class CachePlan:
    """What a batch must compute: its distinct texts the cache lacks (`todo`), each once;
    the others' outputs are known. It travels between the gpu lane's stages as JSON."""

    def __init__(self, texts: Sequence[str], known: Sequence[Any] | None = None) -> None:
        self.distinct, self.index = unique(texts)
        self._know([None] * len(self.distinct) if known is None else known)

    def _know(self, known: Sequence[Any]) -> None:
        self.known = list(known)
        if len(self.known) != len(self.distinct):
            raise ValueError("a cache plan that does not fit its texts")
        self.missing = [n for n, out in enumerate(self.known) if out is None]
        self.todo = [self.distinct[n] for n in self.missing]

    @classmethod
    def make(
        cls, cache: ResultCache, tasks: Sequence[str], labels: Sequence[str], texts: Sequence[str]
    ) -> CachePlan:
        plan = cls(texts)
        plan._know(cache.get(tasks, labels, plan.distinct))
        return plan

    def outputs(self, computed: Sequence[Any]) -> list[Any]:
        """Every text's output, in order, given the outputs computed for `todo`."""
        if len(computed) != len(self.missing):
            raise ValueError(f"{len(computed)} outputs for {len(self.missing)} texts to compute")
        found = list(self.known)
        for n, out in zip(self.missing, computed, strict=True):
            found[n] = out
        return [found[i] for i in self.index]

    def to_json(self) -> str:
        return dumps(self.known)

    @classmethod
    def from_json(cls, texts: Sequence[str], data: bytes | str) -> CachePlan:
        return cls(texts, json.loads(data))


def cached_compute(
    cache: ResultCache,
    tasks: Sequence[str],
    labels: Sequence[str],
    texts: Sequence[str],
    compute: Callable[[Sequence[str]], Sequence[Any]],
    store: Callable[..., None] | None = None,
) -> tuple[list[Any], int]:
    """Outputs for `texts`: cached ones from Redis, the rest from `compute` over the
    distinct missing texts (each once), stored back (an output that is not a dict, a
    failure, is passed through uncached) by `store` (`cache.put`'s arguments; default: at
    once, `cache.put`). Also returns how many texts were computed."""
    plan = CachePlan.make(cache, tasks, labels, texts)
    computed = list(compute(plan.todo)) if plan.todo else []
    (store or cache.put)(tasks, labels, plan.todo, computed)
    return plan.outputs(computed), len(computed)


class StoreBeside:
    """Cache entries kept back (`store` of `cached_compute`), then stored in a thread while
    other work runs: a batch chunk's entries go to Redis while its results go to the
    database (the thread mostly runs while that write waits on the database).

        later = StoreBeside(cache)
        outputs, _ = cached_compute(cache, ..., store=later)
        with later.storing():
            write_results(outputs)
    """

    def __init__(self, cache: ResultCache) -> None:
        self.cache = cache
        self.entries: list[tuple[Any, ...]] = []

    def __call__(self, *entry: Any) -> None:
        self.entries.append(entry)

    def store(self) -> None:
        """Store the entries now (a Redis error: a miss, logged)."""
        for entry in self.entries:
            self.cache.put(*entry)

    def commands(self) -> list[tuple[Any, ...]]:
        """The commands that store the entries, for a round trip the caller makes."""
        return [c for entry in self.entries for c in self.cache.put_commands(*entry)]

    @contextmanager
    def storing(self) -> Iterator[None]:
        """The entries are stored by the time the block ends (a Redis error: a miss)."""
        if not self.cache.enabled or not self.entries:
            yield
            return
        thread = threading.Thread(target=self.store, name="cache-store", daemon=True)
        thread.start()
        try:
            yield
        finally:
            thread.join()
