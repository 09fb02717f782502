"""The direct tokenizer (inference/tokenize.py) gives exactly what transformers' call gives,
or is not used."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from inference.batching import prepare
from inference.encoder import default_model_path
from inference.tokenize import Direct, Words, plain_core, plain_text, template_ids


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(default_model_path())


_BUILT: dict[tuple[int, int], Direct | None] = {}


def built(tokenizer: Any, max_length: int) -> Direct | None:
    """Direct.build, once per tokenizer and max length: its probe costs more than most
    examples (the examples that follow share its word cache, as a worker's chunks do)."""
    key = (id(tokenizer), max_length)
    if key not in _BUILT:
        _BUILT[key] = Direct.build(tokenizer, max_length)
    return _BUILT[key]


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def assert_prepared_alike(tokenizer: Any, direct: Direct, texts: list[str], size: int) -> None:
    want = prepare(tokenizer, texts, direct.core.truncation["max_length"], size)
    got = prepare(tokenizer, texts, direct.core.truncation["max_length"], size, direct=direct)
    assert got.n == want.n == len(texts)
    assert [idx for idx, _ in got.batches] == [idx for idx, _ in want.batches]
    for (_, g), (_, w) in zip(got.batches, want.batches, strict=True):
        assert same(g, w)


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.text(max_size=300), min_size=1, max_size=40),
    size=st.integers(1, 16),
    max_length=st.sampled_from([8, 32, 256]),
)
def test_any_texts_tokenize_as_transformers_tokenizes_them(
    tokenizer: Any, texts: list[str], size: int, max_length: int
) -> None:
    direct = built(tokenizer, max_length)
    assert direct is not None
    assert_prepared_alike(tokenizer, direct, texts, size)


# ASCII texts, most of them plain (the plain core's), some with a control character, tab or
# newline, or a special token's spelling in any case, mixed with texts beyond ASCII (the
# whole core's).
ASCII = st.text(st.characters(max_codepoint=127), max_size=200)
SPELLINGS = st.sampled_from(["[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]", "[cls]", "[Sep]"])
MIXED = st.one_of(
    ASCII,
    st.lists(st.one_of(ASCII, SPELLINGS), max_size=6).map(" ".join),
    st.lists(st.one_of(ASCII, SPELLINGS), max_size=6).map("".join),
    st.text(max_size=60),
)


@settings(max_examples=80, deadline=None)
@given(texts=st.lists(MIXED, min_size=1, max_size=40), size=st.integers(1, 16))
def test_plain_and_other_texts_in_one_chunk_tokenize_as_transformers_tokenizes_them(
    tokenizer: Any, texts: list[str], size: int
) -> None:
    direct = built(tokenizer, 64)
    assert direct is not None and direct.plain is not None and direct.words is not None
    assert_prepared_alike(tokenizer, direct, texts, size)


# Printable ASCII only, words and punctuation runs of every kind: the word cache's texts.
PRINTABLE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=400)
WORDY = st.lists(
    st.one_of(st.sampled_from(["refund", "Refund", "REFUNDED", "unaffable", "x" * 101]), PRINTABLE),
    max_size=30,
).map(" ".join)


@settings(max_examples=80, deadline=None)
@given(
    texts=st.lists(st.one_of(PRINTABLE, WORDY), min_size=1, max_size=30),
    max_length=st.sampled_from([3, 8, 64, 256]),
)
def test_plain_texts_by_the_word_cache_tokenize_as_transformers_tokenizes_them(
    tokenizer: Any, texts: list[str], max_length: int
) -> None:
    direct = built(tokenizer, max_length)
    assert direct is not None and direct.words is not None
    assert_prepared_alike(tokenizer, direct, texts, 7)
    assert_prepared_alike(tokenizer, direct, texts, 7)  # again, every word now cached


def test_the_word_cache_starts_afresh_at_its_limit(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import inference.tokenize as tokenize

    monkeypatch.setattr(tokenize, "WORD_CACHE_LIMIT", 50)
    direct = Direct.build(tokenizer, 64)
    assert direct is not None and direct.words is not None
    texts = [f"order {n} of item {n * 7919} refunded" for n in range(200)]
    assert_prepared_alike(tokenizer, direct, texts, 16)
    assert 0 < len(direct.words.cache) <= 50
    assert 0 < len(direct.words.tokens) <= 50


def test_texts_with_an_added_token_s_spelling_go_to_the_core(tokenizer: Any) -> None:
    direct = Direct.build(tokenizer, 64)
    assert direct is not None and direct.words is not None
    for text in ["a [CLS] b", "x[sep]y", "[Mask]", "[PAD]"]:
        assert direct.words.ids(text) is None
    assert direct.words.ids("a [cl s] b") is not None
    assert_prepared_alike(tokenizer, direct, ["a [CLS] b", "x[sep]y", "[Mask] ok"], 2)


def test_only_a_plain_bert_tokenizer_gets_a_word_cache(tokenizer: Any) -> None:
    import json

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    plain = plain_core(json.dumps(spec), 32)
    assert Words.build(json.dumps(spec), 32, plain) is not None
    assert Words.build(json.dumps(spec), 2, plain) is None  # no room for a text's tokens
    for part, other in [
        ("pre_tokenizer", {"type": "Whitespace"}),
        ("model", {**spec["model"], "type": "BPE"}),
        ("normalizer", {**spec["normalizer"], "lowercase": False}),
        ("post_processor", {"type": "RobertaProcessing"}),
    ]:
        assert Words.build(json.dumps({**spec, part: other}), 32, plain) is None


def test_the_template_s_special_tokens_around_a_single_text() -> None:
    specials = {"[CLS]": {"ids": [101]}, "[SEP]": {"ids": [102]}}
    template = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "[CLS]", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
        ],
        "special_tokens": specials,
    }
    assert template_ids(template) == ([101], [102])
    assert template_ids({"type": "BertProcessing", "cls": ["[CLS]", 7], "sep": ["[SEP]", 9]}) == (
        [7],
        [9],
    )
    typed = {**template, "single": [{"Sequence": {"id": "A", "type_id": 1}}]}
    two = {**template, "single": template["single"] + [{"Sequence": {"id": "B", "type_id": 0}}]}
    unknown = {**template, "special_tokens": {}}
    for processor in (typed, two, unknown, {"type": "ByteLevel"}, {}):
        assert template_ids(processor) is None


def test_a_word_cache_that_disagrees_is_left_out_and_the_plain_core_kept(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    import inference.tokenize as tokenize

    # Splitting at letters only: "abc123" is two words to it, one to BertPreTokenizer.
    monkeypatch.setattr(tokenize, "PLAIN_WORDS", re.compile(r"[a-z]+|[^a-z ]"))
    direct = Direct.build(tokenizer, 32)
    assert direct is not None and direct.plain is not None and direct.words is None
    assert_prepared_alike(tokenizer, direct, ["Hello abc123 World", "caf\u00e9 OK"], 2)


def test_only_printable_ascii_is_plain() -> None:
    assert plain_text("Refund ORDER #12, please! now [CLS] ~`{}")
    assert plain_text("")
    assert not plain_text("caf\u00e9")
    assert not plain_text("a\x00b") and not plain_text("a\x0bb") and not plain_text("a\x7f")
    assert not plain_text("tab\tnewline") and not plain_text("a\nb") and not plain_text("a\rb")


def test_a_tokenizer_without_bert_s_normalizer_has_no_plain_core(tokenizer: Any) -> None:
    import json

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    assert plain_core(json.dumps(spec), 32) is not None
    spec["normalizer"] = {"type": "NFKC"}
    assert plain_core(json.dumps(spec), 32) is None
    spec["normalizer"] = None
    assert plain_core(json.dumps(spec), 32) is None


def test_a_plain_core_that_disagrees_is_left_out_and_the_direct_path_kept(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import inference.tokenize as tokenize

    real = tokenize.plain_core

    def not_lowercasing(spec: str, max_length: int) -> Any:
        core = real(spec, max_length)
        core.normalizer = None  # no lowercasing: "Hello" is not "hello" to this vocabulary
        return core

    monkeypatch.setattr(tokenize, "plain_core", not_lowercasing)
    direct = Direct.build(tokenizer, 32)
    assert direct is not None and direct.plain is None
    assert_prepared_alike(tokenizer, direct, ["Hello World", "caf\u00e9 OK"], 2)


def test_long_texts_are_cut_at_max_length_with_their_special_tokens(tokenizer: Any) -> None:
    direct = Direct.build(tokenizer, 16)
    assert direct is not None
    texts = ["word " * 500, "short", "x" * 2000, ""]
    assert_prepared_alike(tokenizer, direct, texts, 3)
    (idx, enc), *_ = prepare(tokenizer, texts, 16, 4, direct=direct).batches
    assert enc["input_ids"].shape == (4, 16)
    assert enc["input_ids"][idx.index(0), -1] == tokenizer.sep_token_id


def test_an_empty_chunk_has_no_batches(tokenizer: Any) -> None:
    direct = Direct.build(tokenizer, 32)
    assert direct is not None
    assert prepare(tokenizer, [], 32, 8, direct=direct).batches == []


def test_a_left_padding_tokenizer_keeps_transformers_call(tokenizer: Any) -> None:
    left = AutoTokenizer.from_pretrained(default_model_path(), padding_side="left")
    assert Direct.build(left, 32) is None


class Disagreeing:
    """A tokenizer whose call adds what its Rust core does not (a subclass that rewrites
    texts before encoding, say): the probe must catch it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, texts: list[str], **kwargs: Any) -> Any:
        return self.inner([t.upper() + " extra" for t in texts], **kwargs)


def test_a_tokenizer_whose_call_differs_from_its_core_keeps_transformers_call(
    tokenizer: Any,
) -> None:
    assert Direct.build(Disagreeing(tokenizer), 64) is None


def test_a_slow_tokenizer_keeps_transformers_call(tokenizer: Any) -> None:
    class Slow(Disagreeing):
        is_fast = False

        def __call__(self, texts: list[str], **kwargs: Any) -> Any:
            return self.inner(texts, **kwargs)

    assert Direct.build(Slow(tokenizer), 64) is None


def test_threads_tokenize_side_by_side_without_taking_turns(tokenizer: Any) -> None:
    direct = Direct.build(tokenizer, 64)
    assert direct is not None
    texts = [f"message number {i} about a refund " * (i % 7 + 1) for i in range(200)]
    want = prepare(tokenizer, texts, 64, 16)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work() -> None:
        try:
            start.wait()
            for _ in range(10):
                got = prepare(tokenizer, texts, 64, 16, direct=direct)
                for (_, g), (_, w) in zip(got.batches, want.batches, strict=True):
                    assert same(g, w)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_model_tokenizes_directly_unless_it_needs_offsets() -> None:
    from inference.encoder import Encoder

    assert Encoder(batch_size=4).direct is not None
