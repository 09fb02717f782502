"""A batch chunk's result-cache entries are stored in a thread beside its database write,
and are all in Redis by the time that write is done (real Redis)."""

from __future__ import annotations

import threading

import redis

from core.store.cache import ResultCache, StoreBeside, cached_compute


def _cache(settings) -> ResultCache:
    on = settings.replace(cache_ttl=300)
    return ResultCache(redis.Redis.from_url(on.redis_url), on).scoped(7)


def test_entries_are_kept_back_then_stored_beside_the_block(settings):
    cache = _cache(settings)
    texts = ["beside one", "beside two", "beside one"]
    later = StoreBeside(cache)
    outputs, computed = cached_compute(
        cache, ["score"], [], texts, lambda todo: [{"rating": len(t)} for t in todo], later
    )
    assert computed == 2 and outputs[0] == outputs[2] == {"rating": 10}
    # Kept back: nothing is stored until the block runs.
    assert cache.get(["score"], [], ["beside one", "beside two"]) == [None, None]
    seen_inside = threading.Event()
    stored = cache.put

    def put(*entry):
        stored(*entry)
        seen_inside.set()

    cache.put = put
    with later.storing():
        # The store runs while the block does: the block can wait for it.
        assert seen_inside.wait(10), "the entries were not stored beside the block"
    assert cache.get(["score"], [], ["beside one", "beside two"]) == [
        {"rating": 10},
        {"rating": 10},
    ]


def test_the_block_ends_only_once_everything_is_stored(settings):
    cache = _cache(settings)
    later = StoreBeside(cache)
    texts = [f"stored by the end {n}" for n in range(300)]
    cached_compute(cache, ["score"], [], texts, lambda todo: [{"rating": 0.5}] * len(todo), later)
    with later.storing():
        pass
    assert None not in cache.get(["score"], [], texts)


def test_a_failure_in_the_block_still_waits_for_the_store_and_passes_through(settings):
    cache = _cache(settings)
    later = StoreBeside(cache)
    cached_compute(cache, ["score"], [], ["a failing write"], lambda t: [{"rating": 1.0}], later)
    try:
        with later.storing():
            raise RuntimeError("the database write failed")
    except RuntimeError as exc:
        assert "database write" in str(exc)
    else:
        raise AssertionError("the block's error was swallowed")
    assert cache.get(["score"], [], ["a failing write"]) == [{"rating": 1.0}]


def test_a_cache_that_is_off_stores_nothing_and_starts_no_thread(settings):
    off = ResultCache(redis.Redis.from_url(settings.redis_url), settings).scoped(7)
    assert not off.enabled  # tests run with LANEWAY_CACHE_TTL=0
    later = StoreBeside(off)
    cached_compute(off, ["score"], [], ["x"], lambda t: [{"rating": 1.0}], later)
    before = threading.active_count()
    with later.storing():
        assert threading.active_count() == before
