"""Batch chunks share the interactive path's result cache: a cached text is not computed
again, identical texts in a chunk are computed once, and what a chunk computed is stored."""

from __future__ import annotations

import pytest
import redis
from prometheus_client import REGISTRY
from sqlalchemy import select

from core.store.cache import ResultCache
from db.models import Result
from db.session import session_scope
from tests.factories import stored_job

LABELS = ["shipping", "billing"]


@pytest.fixture
def cache_on(settings, worker_app):
    """The workers' settings with the cache on (tests run with LANEWAY_CACHE_TTL=0), and
    the worker's app built from them."""
    on = settings.replace(cache_ttl=300)
    worker_app(on)
    return on


def account_cache(settings, job_id) -> ResultCache:
    """The result cache as the job's account uses it."""
    from db.models import Job

    with session_scope(settings) as session:
        account_id = session.get(Job, job_id).account_id
    return ResultCache(redis.Redis.from_url(settings.redis_url), settings).scoped(account_id)


@pytest.mark.slow
def test_a_chunk_reads_and_fills_the_result_cache(cache_on, migrated):
    from tasks.chunks import run_chunk

    cached_text = "the parcel never came (cached)"
    texts = [cached_text, "charged twice this month", cached_text, "charged twice this month"]
    job_id, (chunk_id,) = stored_job(cache_on, texts, labels=LABELS, prefix="k")
    cache = account_cache(cache_on, job_id)
    planted = {"label": "planted", "score": 0.5, "scores": {"shipping": 0.5, "billing": 0.1}}
    cache.put(["classify"], LABELS, [cached_text], [planted])
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


def test_the_gpu_lane_computes_only_what_the_cache_lacks_and_each_text_once(cache_on, migrated):
    from db.models import Chunk
    from tasks.chunks import model_chunk, post_chunk, prep_chunk

    cached_text = "my order arrived broken (cached, gpu lane)"
    fresh = "I cannot log in to my account since yesterday"
    texts = [cached_text, fresh, fresh, cached_text, fresh]
    job_id, (chunk_id,) = stored_job(cache_on, texts, labels=LABELS, lane="gpu", prefix="g")
    cache = account_cache(cache_on, job_id)
    planted = {"label": "planted", "score": 0.5, "scores": {"shipping": 0.5, "billing": 0.1}}
    cache.put(["classify"], LABELS, [cached_text], [planted])
    prepared = prep_chunk.apply(args=(chunk_id,)).get()
    # Five texts, one distinct one missing from the cache: the model sees it alone.
    assert prepared["computed"] == 1, prepared
    assert model_chunk.apply(args=(chunk_id,)).get()["model_seconds"] > 0
    assert post_chunk.apply(args=(chunk_id,)).get()["items"] == 5
    with session_scope(cache_on) as session:
        rows = {
            r.item_id: r for r in session.scalars(select(Result).where(Result.job_id == job_id))
        }
        assert session.get(Chunk, chunk_id).state == "done"
    assert [rows[f"g{n}"].output == planted for n in range(5)] == [True, False, False, True, False]
    assert rows["g1"].output == rows["g2"].output == rows["g4"].output
    assert rows["g1"].label in LABELS
    (stored,) = cache.get(["classify"], LABELS, [fresh])
    assert stored == rows["g1"].output
    # Nothing of the hand-off is left behind.
    r = redis.Redis.from_url(cache_on.redis_url)
    assert not r.keys(f"laneway:chunk:{chunk_id}:*")


def test_a_gpu_chunk_the_cache_answers_whole_ends_at_prep(cache_on, migrated):
    from db.models import Chunk
    from tasks.chunks import model_chunk, post_chunk, prep_chunk

    texts = ["refund my second charge (all cached)", "the box was empty (all cached)"]
    job_id, (chunk_id,) = stored_job(cache_on, texts, labels=LABELS, lane="gpu", prefix="c")
    planted = [
        {"label": "billing", "score": 0.9, "scores": {"shipping": 0.1, "billing": 0.9}},
        {"label": "shipping", "score": 0.8, "scores": {"shipping": 0.8, "billing": 0.2}},
    ]
    account_cache(cache_on, job_id).put(["classify"], LABELS, texts, planted)
    assert prep_chunk.apply(args=(chunk_id,)).get()["items"] == 2
    with session_scope(cache_on) as session:
        chunk = session.get(Chunk, chunk_id)
        assert (chunk.state, chunk.model_seconds) == ("done", None)
        found = session.scalars(select(Result).where(Result.job_id == job_id).order_by(Result.idx))
        assert [r.output for r in found] == planted
    # The chain's later messages find the chunk finished: no model runs for it.
    assert model_chunk.apply(args=(chunk_id,)).get() == {"chunk": chunk_id, "skipped": True}
    assert post_chunk.apply(args=(chunk_id,)).get() == {"chunk": chunk_id, "skipped": True}


def _model_figures(lane: str) -> dict[str, float]:
    """This process's model-stage figures for a lane: batches, texts in them, stages timed."""
    labels = {"lane": lane}
    return {
        name: REGISTRY.get_sample_value(sample, labels) or 0.0
        for name, sample in (
            ("batches", "laneway_batch_size_count"),
            ("texts", "laneway_batch_size_sum"),
            ("stages", "laneway_model_stage_seconds_count"),
            ("seconds", "laneway_model_stage_seconds_sum"),
        )
    }


def test_batch_sizes_are_the_batches_the_model_ran_not_the_chunks_size(
    cache_on, migrated, monkeypatch, worker_app
):
    from tasks.chunks import run_chunk

    # Shared by the operator's choice: the second job, another account's, finds it all.
    cache_on = cache_on.replace(cache_shared=True)
    worker_app(cache_on)

    cached_text = "where is my parcel (cached for the metrics test)"
    fresh = ["refund the second charge please", "the courier left it at the wrong door"]
    # Six items: one cached text twice, two texts to compute, each twice.
    texts = [cached_text, fresh[0], fresh[1], cached_text, fresh[0], fresh[1]]
    cache = ResultCache(redis.Redis.from_url(cache_on.redis_url), cache_on).scoped("anyone")
    planted = {"label": "shipping", "score": 0.5, "scores": {"shipping": 0.5, "billing": 0.1}}
    cache.put(["classify"], LABELS, [cached_text], [planted])
    before = _model_figures("cpu")
    _, (chunk_id,) = stored_job(cache_on, texts, labels=LABELS, prefix="m")
    run_chunk.apply(args=(chunk_id,)).get()
    after = _model_figures("cpu")
    # One micro-batch of the two texts the cache lacked, not one of the chunk's six.
    assert after["batches"] - before["batches"] == 1
    assert after["texts"] - before["texts"] == 2
    assert after["stages"] - before["stages"] == 1 and after["seconds"] > before["seconds"]

    # Every text cached now: the model never ran, so nothing is recorded (no 0.0 stage).
    _, (again,) = stored_job(cache_on, texts, labels=LABELS, prefix="n")
    run_chunk.apply(args=(again,)).get()
    assert _model_figures("cpu") == after


def _outputs(settings, job_id) -> list:
    with session_scope(settings) as session:
        found = session.scalars(select(Result).where(Result.job_id == job_id).order_by(Result.idx))
        return [r.output for r in found]


@pytest.mark.parametrize("lane", ["cpu", "gpu"])
def test_a_chunk_never_uses_another_accounts_cache_entries(cache_on, migrated, lane):
    """Account A's entry (planted: an answer the model never gives) is invisible to B's
    job of the same text, and B's computed output does not land in A's entries."""
    from tasks.chunks import model_chunk, post_chunk, prep_chunk, run_chunk

    text = f"a text only account A sent before ({lane})"
    planted = {"label": "planted", "score": 0.5, "scores": {"shipping": 0.5, "billing": 0.1}}
    job_a, (chunk_a,) = stored_job(cache_on, [text], labels=LABELS, lane=lane, prefix="a")
    account_cache(cache_on, job_a).put(["classify"], LABELS, [text], [planted])
    job_b, (chunk_b,) = stored_job(cache_on, [text, text], labels=LABELS, lane=lane, prefix="b")
    for chunk_id in (chunk_a, chunk_b):
        if lane == "cpu":
            run_chunk.apply(args=(chunk_id,)).get()
            continue
        prep_chunk.apply(args=(chunk_id,)).get()
        model_chunk.apply(args=(chunk_id,)).get()
        post_chunk.apply(args=(chunk_id,)).get()
    assert _outputs(cache_on, job_a) == [planted]
    b_outputs = _outputs(cache_on, job_b)
    assert b_outputs[0] == b_outputs[1] != planted and b_outputs[0]["label"] in LABELS
    # Each account's entry is its own: A still has the planted one, B its computed one.
    assert account_cache(cache_on, job_a).get(["classify"], LABELS, [text]) == [planted]
    assert account_cache(cache_on, job_b).get(["classify"], LABELS, [text]) == [b_outputs[0]]


def test_an_embed_chunk_caches_its_vectors_as_bytes_and_reads_them_back(
    cache_on, worker_app, migrated
):
    """An embedding's cache entry is its JSON fields then float32 bytes, not JSON numbers;
    a later chunk reads it back to the same numbers, and an entry written as JSON alone
    (before vectors were bytes) still reads. (The cache is shared here: each job is its
    own account's.)"""
    import json

    import numpy as np

    from core.store.cache import VECTOR_AFTER, read_entry
    from jobs.results import result_record
    from tasks.chunks import run_chunk

    shared = cache_on.replace(cache_shared=True)
    worker_app(shared)
    texts = ["my parcel is late", "written before vectors were bytes"]
    job_id, (chunk_id,) = stored_job(shared, texts[:1], tasks=["embed"], prefix="b")
    cache = account_cache(shared, job_id)
    old = {"embedding": [0.25, -0.0, 0.125], "tokens": 4}
    key = cache._keys(["embed"], [], texts[1:])[0][0]
    cache.redis.set(key, json.dumps(old).encode())
    run_chunk.apply(args=(chunk_id,)).get()
    (raw,) = [cache.redis.get(k) for row in cache._keys(["embed"], [], texts[:1]) for k in row]
    text, after, packed = raw.partition(VECTOR_AFTER)
    assert after and len(packed) == 384 * 4 and json.loads(text) == {"tokens": 6}
    with session_scope(shared) as session:
        (row,) = session.scalars(select(Result).where(Result.job_id == job_id))
        computed = result_record(row)["embedding"]
    got, before = cache.get(["embed"], [], texts)
    assert isinstance(got["embedding"], np.ndarray)
    assert got["embedding"].tolist() == computed
    assert before == old and read_entry(json.dumps(old).encode()) == old

    # A second job of the same texts takes both from the cache and stores the same rows.
    again, (chunk,) = stored_job(shared, texts, tasks=["embed"], prefix="c")
    run_chunk.apply(args=(chunk,)).get()
    with session_scope(shared) as session:
        rows = session.scalars(select(Result).where(Result.job_id == again).order_by(Result.idx))
        records = [result_record(r) for r in rows]
    assert records == [{"id": "c0", **{"tokens": 6, "embedding": computed}}, {"id": "c1", **old}]
