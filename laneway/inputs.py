"""Parse and validate job input (JSON items, CSV or JSONL files) into (id, text) pairs.

Every problem raises InputError with a message that names it, and the line for files.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

MAX_ID_CHARS = 200
MAX_LABELS = 50
MAX_LABEL_CHARS = 100


class InputError(ValueError):
    """The input is malformed; the message says what and where."""


@dataclass(frozen=True)
class Limits:
    max_items: int
    max_text_chars: int


def parse_labels(raw: Any, default: Sequence[str] | None) -> list[str] | None:
    """A list (or comma-separated string) of 2..50 distinct, non-empty labels."""
    if raw is None or raw == "" or raw == []:
        return list(default) if default is not None else None
    if isinstance(raw, str):
        raw = [part.strip() for part in raw.split(",") if part.strip()]
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise InputError("labels must be a list of strings")
    labels = [x.strip() for x in raw]
    if any(not x for x in labels):
        raise InputError("labels must not be empty strings")
    for label in labels:
        _check_storable(label, "a label")
    if any(len(x) > MAX_LABEL_CHARS for x in labels):
        raise InputError(f"a label is longer than {MAX_LABEL_CHARS} characters")
    if len(labels) < 2 or len(labels) > MAX_LABELS:
        raise InputError(f"labels must name between 2 and {MAX_LABELS} labels, got {len(labels)}")
    if len(set(labels)) != len(labels):
        raise InputError("labels must be distinct")
    return labels


def _check_storable(value: str, where: str) -> None:
    """Postgres stores neither NUL characters nor lone surrogates ("\ud800" in JSON)."""
    if "\x00" in value:
        raise InputError(f"{where} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{where} contains an invalid character (a lone surrogate)") from None


class _Collector:
    """Accumulate items, enforcing ids, texts and the item limit as they arrive."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.items: list[tuple[str, str]] = []
        self.seen: set[str] = set()

    def add(self, item_id: Any, text: Any, where: str) -> None:
        if item_id is None:
            raise InputError(f"{where}: 'id' is missing")
        if text is None:
            raise InputError(f"{where}: 'text' is missing")
        if isinstance(item_id, bool) or not isinstance(item_id, (str, int)):
            raise InputError(f"{where}: 'id' must be a string or an integer")
        item_id = str(item_id).strip()
        if not item_id:
            raise InputError(f"{where}: 'id' is missing or empty")
        if len(item_id) > MAX_ID_CHARS:
            raise InputError(f"{where}: 'id' is longer than {MAX_ID_CHARS} characters")
        if not isinstance(text, str):
            raise InputError(f"{where}: 'text' must be a string")
        if not text.strip():
            raise InputError(f"{where}: 'text' is empty")
        if len(text) > self.limits.max_text_chars:
            raise InputError(
                f"{where}: 'text' has {len(text)} characters, more than the limit of "
                f"{self.limits.max_text_chars} (LANEWAY_MAX_TEXT_CHARS)"
            )
        for field, value in (("id", item_id), ("text", text)):
            _check_storable(value, f"{where}: '{field}'")
        if item_id in self.seen:
            raise InputError(f"{where}: duplicate id {item_id!r}")
        if len(self.items) >= self.limits.max_items:
            raise InputError(
                f"{where}: more than {self.limits.max_items} items, the limit per job "
                "(LANEWAY_MAX_ITEMS)"
            )
        self.seen.add(item_id)
        self.items.append((item_id, text))

    def done(self) -> list[tuple[str, str]]:
        if not self.items:
            raise InputError("the job has no items")
        return self.items


def parse_json_items(raw: Any, limits: Limits) -> list[tuple[str, str]]:
    if not isinstance(raw, list):
        raise InputError('\'items\' must be a list of {"id": ..., "text": ...} objects')
    out = _Collector(limits)
    for n, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InputError(f"items[{n}]: must be an object with 'id' and 'text'")
        out.add(item.get("id"), item.get("text"), f"items[{n}]")
    return out.done()


def _lines(stream: BinaryIO) -> Iterable[tuple[int, str]]:
    """Decode UTF-8 line by line, so an invalid byte is reported with its line number."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    number = 0
    for number, raw in enumerate(stream, start=1):
        try:
            yield number, decoder.decode(raw)
        except UnicodeDecodeError:
            raise InputError(f"line {number}: not valid UTF-8") from None
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise InputError(f"line {number}: not valid UTF-8 (the file ends mid-character)") from None


def parse_jsonl(stream: BinaryIO, limits: Limits) -> list[tuple[str, str]]:
    out = _Collector(limits)
    for number, line in _lines(stream):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"line {number}: not valid JSON ({exc.msg})") from None
        except (ValueError, RecursionError) as exc:  # huge integers, absurd nesting
            raise InputError(f"line {number}: not valid JSON ({type(exc).__name__})") from None
        if not isinstance(obj, dict):
            raise InputError(f"line {number}: must be a JSON object with 'id' and 'text'")
        out.add(obj.get("id"), obj.get("text"), f"line {number}")
    return out.done()


def parse_csv(stream: BinaryIO, limits: Limits) -> list[tuple[str, str]]:
    text_lines = (line for _, line in _lines(stream))
    reader = csv.reader(text_lines, strict=True)
    out = _Collector(limits)
    try:
        header = next(reader, None)
        if header is None:
            raise InputError("the CSV file is empty")
        columns = [h.strip().lower() for h in header]
        if "id" not in columns or "text" not in columns:
            raise InputError("line 1: the CSV header must name the columns 'id' and 'text'")
        id_col, text_col = columns.index("id"), columns.index("text")
        for row in reader:
            where = f"line {reader.line_num}"
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(columns):
                raise InputError(f"{where}: expected {len(columns)} columns, found {len(row)}")
            out.add(row[id_col], row[text_col], where)
    except csv.Error as exc:
        raise InputError(f"line {reader.line_num}: malformed CSV ({exc})") from None
    return out.done()


def parse_file(filename: str, stream: BinaryIO, limits: Limits) -> list[tuple[str, str]]:
    """Parse a CSV (`.csv`) or JSONL (`.jsonl`, `.ndjson`) upload."""
    name = (filename or "").lower()
    if name.endswith(".csv"):
        return parse_csv(stream, limits)
    if name.endswith((".jsonl", ".ndjson")):
        return parse_jsonl(stream, limits)
    raise InputError(f"unsupported file type {filename!r}: upload a .csv or .jsonl file")


def parse_bytes(filename: str, data: bytes, limits: Limits) -> list[tuple[str, str]]:
    return parse_file(filename, io.BytesIO(data), limits)
