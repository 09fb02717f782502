"""Batch chunks share the interactive path's result cache: a cached text is not computed
again, identical texts in a chunk are computed once, and what a chunk computed is stored."""

from __future__ import annotations

import dataclasses

import pytest
import redis
from sqlalchemy import select

from db.models import Result
from db.session import session_scope
from laneway.cache import ResultCache
from tests.factories import stored_job

LABELS = ["shipping", "billing"]


@pytest.fixture
def cache_on(settings, monkeypatch):
    """The workers' settings with the cache on (tests run with LANEWAY_CACHE_TTL=0)."""
    import tasks.chunks

    on = dataclasses.replace(settings, cache_ttl=300)
    monkeypatch.setattr(tasks.chunks, "get_settings", lambda: on)
    return on


def test_a_chunk_reads_and_fills_the_result_cache(cache_on, migrated):
    from tasks.chunks import run_chunk

    cached_text = "the parcel never came (cached)"
    texts = [cached_text, "charged twice this month", cached_text, "charged twice this month"]
    cache = ResultCache(redis.Redis.from_url(cache_on.redis_url), cache_on)
    planted = {"label": "planted", "score": 0.5, "scores": {"shipping": 0.5, "billing": 0.1}}
    cache.put(["classify"], LABELS, [cached_text], [planted])
    job_id, (chunk_id,) = stored_job(cache_on, texts, labels=LABELS, prefix="k")
    run_chunk.apply(args=(chunk_id,)).get()
    with session_scope(cache_on) as session:
        found = session.scalars(select(Result).where(Result.job_id == job_id))
        rows = {r.item_id: r for r in found}
    # The cached text came from the cache (a planted answer the model would never give).
    assert rows["k0"].output == planted and rows["k2"].output == planted
    assert rows["k0"].label == "planted"
    # The other text was computed once for its two items, and is now in the cache.
    assert rows["k1"].output == rows["k3"].output and rows["k1"].label == "billing"
    (stored,) = cache.get(["classify"], LABELS, ["charged twice this month"])
    assert stored == rows["k1"].output
