"""Result-cache keys: a hash of (model, task, parameters, text); identical texts once."""

from __future__ import annotations

from core.config.settings import Settings
from core.store.cache import (
    ResultCache,
    cache_key,
    cache_scope,
    cached_compute,
    task_identity,
    unique,
)


def key(settings, task, labels, text):
    return cache_key(task_identity(settings, task, labels), text)


def test_keys_differ_by_model_task_parameters_and_text():
    s = Settings.from_env({})
    base = key(s, "classify", ["a", "b"], "hello")
    assert base == key(s, "classify", ["a", "b"], "hello")
    assert base.startswith("laneway:cache:") and "hello" not in base
    others = {
        key(s, "classify", ["a", "c"], "hello"),
        key(s, "classify", ["b", "a"], "hello"),  # label order decides `label` on ties
        key(s, "classify", ["a", "b"], "hello!"),
        key(s, "embed", [], "hello"),
        key(s, "score", [], "hello"),
        key(s.replace(max_length=64), "classify", ["a", "b"], "hello"),
        key(s.replace(score_anchors=("x", "y")), "score", [], "hello"),
    }
    assert base not in others and len(others) == 7
    # Labels do not matter to tasks that take none.
    assert key(s, "embed", ["a", "b"], "t") == key(s, "embed", [], "t")


def test_a_lone_surrogate_still_has_a_key():
    s = Settings.from_env({})
    assert key(s, "embed", [], "bad \udc80 text") != key(s, "embed", [], "bad  text")


def test_identical_texts_are_computed_once_even_without_a_cache():
    s = Settings.from_env({"LANEWAY_CACHE_TTL": "0"})
    seen: list[list[str]] = []

    def compute(texts):
        seen.append(list(texts))
        return [{"embedding": [len(t)]} for t in texts]

    cache = ResultCache(None, s)
    assert not cache.enabled
    texts = ["a", "bb", "a", "ccc", "bb"]
    outputs, computed = cached_compute(cache, ["embed"], [], texts, compute)
    assert seen == [["a", "bb", "ccc"]] and computed == 3
    assert [o["embedding"][0] for o in outputs] == [1, 2, 1, 3, 2]
    assert unique(texts) == (["a", "bb", "ccc"], [0, 1, 0, 2, 1])


def test_entries_are_per_account_unless_shared():
    s = Settings.from_env({})
    a, b = cache_scope(s, 1), cache_scope(s, 2)
    assert a != b
    mine = cache_key(task_identity(s, "embed", [], a), "hello")
    assert mine != cache_key(task_identity(s, "embed", [], b), "hello")
    shared = s.replace(cache_shared=True)
    assert cache_scope(shared, 1) == cache_scope(shared, 2)


def test_a_cache_without_an_account_reads_and_stores_nothing():
    s = Settings.from_env({})

    class Refuse:
        def __getattr__(self, name):
            raise AssertionError(f"an unscoped cache used Redis ({name})")

    cache = ResultCache(Refuse(), s)  # type: ignore[arg-type]
    assert not cache.enabled and not cache.scoped(None).enabled
    assert cache.get(["embed"], [], ["x"]) == [None]
    cache.put(["embed"], [], ["x"], [{"embedding": [1]}])
    assert cache.scoped(7).enabled and cache.scoped(7).scope == "account:7"
