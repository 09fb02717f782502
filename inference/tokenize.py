"""A chunk's texts tokenized by the fast tokenizer's Rust core in one call.

transformers' tokenizer call sets the Rust tokenizer's truncation and padding on every
call, encodes, then turns each text's encoding into Python lists and the lists into
tensors: for a micro-batch of short texts that wrapping costs more than the encoding
itself. `Direct` keeps its own copy of the Rust tokenizer with truncation set once and no
padding, encodes all of a chunk's texts in one `encode_batch_fast` (no character offsets,
which only span tasks ask for), and pads each micro-batch with numpy. It is built only
where it gives exactly what transformers' call gives (a probe of texts compared token for
token when it is built): otherwise `build` answers None and the caller tokenizes through
transformers.

A BERT tokenizer's normalizer (BertNormalizer) walks every character keeping each one's
alignment, in several passes: much of the encoding's time on short texts. On a text of
printable ASCII all it does is lowercase (on an uncased model): such texts go to a second
copy of the core whose normalizer only lowercases (`plain`), the rest to the whole core.
The probe checks both paths.

Even the plain core splits, looks up and builds an encoding object for every word of
every text, with no memory of words it has seen. Words repeat (a chunk of messages uses
far fewer distinct words than it holds), so plain texts
go, where the tokenizer is a plain BERT one (`Words.build`), through a cache of pieces: a
text is lowercased and split at its spaces (str.split, in C), and each space-separated
token's ids come from a cache of tokens; a token met the first time is split as
BertPreTokenizer splits printable ASCII (runs of letters and digits, each other character
alone: a regular expression, which costs more than everything else together) and each
word's ids come from a second cache, of words, or from the core's own WordPiece model the
first time. A space always ends a word, so a token's ids are its words' ids whatever
surrounds it. A text that holds an added token's spelling goes to the core. The probe
checks it like the rest.

Its copies are never changed after they are built, so threads may encode through them side
by side without taking turns; threads fill the word cache side by side too (a dict's get and
set are atomic, and a word two threads learn at once is learned alike).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

# Texts whose tokens the direct path must match exactly before it is used: empty, spaces
# only, accents and case, CJK, emoji, punctuation runs, a special token's spelling, and
# texts past any max length (truncation).
PROBE = (
    "",
    "   ",
    "Hello, world!",
    "Ça coûte 12,50 € — très CHER... n'est-ce pas?",
    "東京で会いましょう。",
    "great product 👍🏽 would buy again!!!",
    "[CLS] [SEP] [PAD] [MASK] <s> </s> <pad>",
    "Plain [SEP] TEXT with [cls] Spellings",  # plain: the word cache hands it to the plain core
    "tab\tand\nnewline  double  space",
    "word " * 700,
    "x" * 3000,
    "Ctrl\x01chars\x00in\x7fA\x0bWORD\x0c and\ttab\nline\rreturn\x1c\x1f end",
    "Order_#A12-b7 (ref: 9/10) $12.50+tax; me@x.io ~`q` {x}|\\^ done_ " + "ab" * 60,
)
# Distinct words, and space-separated tokens, each cache holds before it starts afresh: a
# bounded few megabytes, many times those of any chunk of messages (numbers and ids keep
# adding new ones).
WORD_CACHE_LIMIT = 50_000
# BertPreTokenizer's words in lowercased printable ASCII: runs of letters and digits, and
# each other character but the space alone (ASCII's punctuation is all of those).
PLAIN_WORDS = re.compile(r"[a-z0-9]+|[^a-z0-9 ]")


class Direct:
    """The tokenizer's Rust core, set to truncate at `max_length`, for whole chunks."""

    def __init__(
        self, core: Any, names: Sequence[str], pad_id: int, plain: Any = None, words: Any = None
    ) -> None:
        """`plain`: the core for plain texts (`plain_core`), or None: every text through
        `core`; `words`: plain texts' ids by a cache of words (`Words`), or None."""
        self.core = core
        self.names = tuple(names)
        self.pad_id = pad_id
        self.plain = plain
        self.words = words
        # Single texts' type ids are the template's constants, zero in every BERT-like
        # template: read once here, then (checked by the probe) never per text.
        self.zero_types = all(
            not any(e.type_ids) for e in core.encode_batch_fast(["a", "a b", "a b c"])
        )

    @classmethod
    def build(cls, tokenizer: Any, max_length: int) -> Direct | None:
        """The direct path for `tokenizer` at `max_length`, or None where it would differ
        from transformers' call (not a fast tokenizer, left padding or truncation, inputs
        other than ids, type ids and mask, or any probe text's tokens)."""
        from tokenizers import Tokenizer

        names = list(getattr(tokenizer, "model_input_names", ()))
        if (
            not getattr(tokenizer, "is_fast", False)
            or getattr(tokenizer, "padding_side", "right") != "right"
            or getattr(tokenizer, "truncation_side", "right") != "right"
            or tokenizer.pad_token_id is None
            or "input_ids" not in names
            or not set(names) <= {"input_ids", "token_type_ids", "attention_mask"}
        ):
            return None
        spec = tokenizer.backend_tokenizer.to_str()
        core = Tokenizer.from_str(spec)
        core.enable_truncation(max_length)
        core.no_padding()
        pad_id = int(tokenizer.pad_token_id)
        # With the plain core and the word cache where there are; should either disagree,
        # without it.
        plain = plain_core(spec, max_length)
        words = Words.build(spec, max_length, plain) if plain is not None else None
        candidates = [(plain, words), (plain, None), (None, None)]
        for candidate, cache in dict.fromkeys(candidates):
            direct = cls(core, names, pad_id, candidate, cache)
            try:
                if direct._agrees(tokenizer, max_length):
                    return direct
            except Exception as exc:  # noqa: BLE001 - any surprise: transformers' call stays
                log.warning("direct tokenizing not used: %s", exc)
                return None
        return None

    def _agrees(self, tokenizer: Any, max_length: int) -> bool:
        """True when every probe text, alone and all together, tokenizes as transformers'
        call tokenizes it."""
        groups = [[t] for t in PROBE] + [list(PROBE)]
        for texts in groups:
            want = tokenizer(
                texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
            )
            got = self.batches(texts, list(range(len(texts))), len(texts))[0][1]
            if set(got) != set(want) or any(not torch.equal(got[k], want[k]) for k in want):
                return False
        return True

    def batches(
        self, texts: Sequence[str], order: Sequence[int], batch_size: int
    ) -> list[tuple[list[int], dict[str, torch.Tensor]]]:
        """The texts in `order`, tokenized, in micro-batches of `batch_size`, each padded to
        its longest text: (the input positions it holds, its tensors)."""
        typed = "token_type_ids" in self.names and not self.zero_types
        if typed:
            encodings = self._encode([texts[i] for i in order])
            ids, types = [e.ids for e in encodings], [e.type_ids for e in encodings]
        else:
            ids, types = self._ids([texts[i] for i in order]), []
        out = []
        for begin in range(0, len(order), batch_size):
            rows = ids[begin : begin + batch_size]
            lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            width = int(lengths.max()) if len(rows) else 0
            mask = np.arange(width) < lengths[:, None]
            tensors: dict[str, torch.Tensor] = {}
            for name in self.names:
                if name == "attention_mask":
                    tensors[name] = torch.from_numpy(mask.astype(np.int64))
                    continue
                if name == "token_type_ids" and not typed:
                    tensors[name] = torch.zeros((len(rows), width), dtype=torch.int64)
                    continue
                source = rows if name == "input_ids" else types[begin : begin + batch_size]
                pad = self.pad_id if name == "input_ids" else 0
                grid = np.full((len(rows), width), pad, dtype=np.int64)
                flat = chain.from_iterable(source)
                grid[mask] = np.fromiter(flat, dtype=np.int64, count=int(lengths.sum()))
                tensors[name] = torch.from_numpy(grid)
            out.append((list(order[begin : begin + batch_size]), tensors))
        return out

    def _ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids, in order: plain texts by the word cache where it takes them."""
        words = self.words
        if words is None:
            return [e.ids for e in self._encode(texts)]
        out = [words.ids(t) if plain_text(t) else None for t in texts]
        rest = [i for i, ids in enumerate(out) if ids is None]
        if rest:
            for i, encoding in zip(rest, self._encode([texts[i] for i in rest]), strict=True):
                out[i] = encoding.ids
        return out  # type: ignore[return-value] - every None was filled

    def _encode(self, texts: list[str]) -> list[Any]:
        """Each text's encoding, in order: plain texts through the plain core."""
        if self.plain is None:
            return self.core.encode_batch_fast(texts)
        simple = [plain_text(t) for t in texts]
        if all(simple):
            return self.plain.encode_batch_fast(texts)
        out: list[Any] = [None] * len(texts)
        for wanted, core in ((True, self.plain), (False, self.core)):
            places = [i for i, s in enumerate(simple) if s is wanted]
            if places:
                encoded = core.encode_batch_fast([texts[i] for i in places])
                for i, encoding in zip(places, encoded, strict=True):
                    out[i] = encoding
        return out


def plain_text(text: str) -> bool:
    """Printable ASCII (no control character, tab and newline included: BertNormalizer
    drops the others and makes those spaces): a text that it, at most, lowercases."""
    return text.isascii() and text.isprintable()


def plain_core(spec: str, max_length: int) -> Any | None:
    """For a tokenizer (its JSON `spec`) whose normalizer is BertNormalizer: a copy whose
    normalizer only lowercases where BertNormalizer does (or none), for plain texts. The
    rest of what BertNormalizer does (control characters and whitespace, accents, spacing
    around CJK characters) changes nothing in them, and added tokens are matched as in the
    whole core: before the normalizer, or after it on the same lowercased text. None for
    any other normalizer."""
    from tokenizers import Tokenizer, normalizers

    raw = json.loads(spec)
    normalizer = raw.get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer":
        return None
    raw["normalizer"] = None
    plain = Tokenizer.from_str(json.dumps(raw))
    if normalizer.get("lowercase", True):
        plain.normalizer = normalizers.Lowercase()
    plain.enable_truncation(max_length)
    plain.no_padding()
    return plain


class Words:
    """Plain texts' ids through a cache of each word's WordPiece ids (see the module's
    docstring): for a BERT tokenizer alone (BertNormalizer lowercasing, BertPreTokenizer,
    WordPiece, a template of special tokens around the text, type ids zero), truncated as
    the core truncates (the text's tokens cut, the template's kept)."""

    def __init__(
        self, model: Any, first: Sequence[int], last: Sequence[int], room: int, added: Sequence[str]
    ) -> None:
        self.model = model  # the core's WordPiece model: a word's pieces the first time
        self.first, self.last = list(first), list(last)
        self.bound = len(self.first) + room  # the template's leading ids and the text's
        # Texts holding an added token's spelling, in any case, go to the core: it matches
        # those before splitting.
        self.added = re.compile("|".join(re.escape(a.lower()) for a in added)) if added else None
        self.tokens: dict[str, tuple[int, ...]] = {}  # a space-separated token's ids
        self.cache: dict[str, tuple[int, ...]] = {}  # a word's ids

    @classmethod
    def build(cls, spec: str, max_length: int, plain: Any) -> Words | None:
        """The word cache for the tokenizer whose JSON is `spec`, its pieces from `plain`'s
        model; None where the tokenizer is not such a BERT one."""
        raw = json.loads(spec)
        normalizer = raw.get("normalizer") or {}
        if (
            (raw.get("model") or {}).get("type") != "WordPiece"
            or raw.get("pre_tokenizer") != {"type": "BertPreTokenizer"}
            or normalizer.get("type") != "BertNormalizer"
            or not normalizer.get("lowercase", True)
        ):
            return None
        around = template_ids(raw.get("post_processor") or {})
        if around is None:
            return None
        first, last = around
        room = max_length - len(first) - len(last)
        if room < 1:
            return None
        added = [token["content"] for token in raw.get("added_tokens") or ()]
        return cls(plain.model, first, last, room, added)

    def ids(self, text: str) -> list[int] | None:
        """A plain text's ids, or None for a text the core must take (an added token's
        spelling in it)."""
        lowered = text.lower()
        if self.added is not None and self.added.search(lowered):
            return None
        tokens = lowered.split()
        bound = self.bound
        # Every token has a word, and every word an id: `bound` tokens are more than enough.
        del tokens[bound:]
        found = list(map(self.tokens.get, tokens))  # the lookups, the count and the join in C
        place = 0
        for _ in range(found.count(None)):  # tokens not met before (ids, numbers): learned
            place = found.index(None, place)
            found[place] = self._token(tokens[place])
        out = [*self.first, *chain.from_iterable(found)]
        del out[bound:]
        out += self.last
        return out

    def _token(self, token: str) -> tuple[int, ...]:
        """A space-separated token's ids: its words' (BertPreTokenizer's split), each from
        the word cache or learned."""
        words = self.cache
        pieces = tuple(chain.from_iterable(
            words.get(word) or self._learn(word) for word in PLAIN_WORDS.findall(token)
        ))  # fmt: skip
        _remember(self.tokens, token, pieces)
        return pieces

    def _learn(self, word: str) -> tuple[int, ...]:
        pieces = tuple(token.id for token in self.model.tokenize(word))
        _remember(self.cache, word, pieces)
        return pieces


def _remember(cache: dict[str, tuple[int, ...]], key: str, pieces: tuple[int, ...]) -> None:
    """Into a cache of at most WORD_CACHE_LIMIT entries, which starts afresh when full."""
    if len(cache) >= WORD_CACHE_LIMIT:
        cache.clear()
    cache[key] = pieces


def template_ids(processor: dict[str, Any]) -> tuple[list[int], list[int]] | None:
    """The special tokens' ids a post-processor puts before and after a single text, or
    None where it does more (type ids other than zero, more than one sequence)."""
    if processor.get("type") == "BertProcessing":
        return [int(processor["cls"][1])], [int(processor["sep"][1])]
    if processor.get("type") != "TemplateProcessing":
        return None
    specials = processor.get("special_tokens") or {}
    first: list[int] = []
    last: list[int] = []
    seen = False
    for piece in processor.get("single") or ():
        if "Sequence" in piece and piece["Sequence"].get("id") == "A" and not seen:
            seen = piece["Sequence"].get("type_id", 0) == 0
            if not seen:
                return None
        elif "SpecialToken" in piece and piece["SpecialToken"].get("type_id", 0) == 0:
            name = piece["SpecialToken"]["id"]
            if name not in specials:
                return None
            (last if seen else first).extend(int(i) for i in specials[name]["ids"])
        else:
            return None
    return (first, last) if seen else None
