"""Parse and validate job input (JSON items, CSV or JSONL files, gzipped or not) lazily.

Items flow through as (id, text, place) rows while they are stored, so memory stays bounded
whatever the size of a file. Every problem raises InputError with a message that names it,
and the line for files.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, BinaryIO

import orjson

MAX_ID_CHARS = 200
MAX_LABELS = 50
MAX_LABEL_CHARS = 100
MAX_NAME_CHARS = 100  # an account's or an API key's name: its column's width (db/models.py)


class InputError(ValueError):
    """The input is malformed; the message says what and where."""


class TruncatedInput(InputError):
    """A gzip stream ends before its end marker: truncated, or still being written."""


DEFAULT_MAX_BLANK_LINES = 10_000
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Limits:
    max_items: int
    max_text_chars: int
    # The setting that names the item limit, for the message (it differs by account type).
    max_items_setting: str = "LANEWAY_MAX_ITEMS"
    # Bytes a file may hold once inflated (None: no bound but the caller's), and the
    # setting that names it: a small gzip file must not cost more than its plain self.
    max_bytes: int | None = None
    max_bytes_setting: str = "LANEWAY_MAX_UPLOAD_BYTES"
    # Lines in a row without an item (blank or whitespace only): a stream of nothing is
    # refused after this many rather than read to its end.
    max_blank_lines: int = DEFAULT_MAX_BLANK_LINES


def parse_json_body(data: bytes, allowed: Iterable[str]) -> dict[str, Any]:
    """A request body that must be a JSON object with only the `allowed` fields."""
    try:
        body = json.loads(data)
    except UnicodeDecodeError as exc:
        raise InputError(f"the JSON body is not valid UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"the body is not a valid JSON object: {exc.msg} (line {exc.lineno}, "
            f"column {exc.colno})"
        ) from None
    except RecursionError:
        raise InputError("the body is not a valid JSON object: nested too deeply") from None
    except ValueError as exc:  # integers longer than Python converts
        raise InputError(f"the body is not a valid JSON object: {exc}") from None
    if not isinstance(body, dict):
        raise InputError(f"the body must be a JSON object, not a JSON {_json_type(body)}")
    check_fields(body, allowed)
    return body


def check_fields(fields: Iterable[str], allowed: Iterable[str]) -> None:
    """Refuse unknown fields: a misspelt one would otherwise be silently ignored."""
    allowed = set(allowed)
    # A multipart part may come without a name (None): sort by text, never compare None.
    unknown = sorted(set(fields) - allowed, key=str)
    if unknown:
        raise InputError(
            f"unknown field {unknown[0]!r}; known fields: {', '.join(sorted(allowed))}"
        )


def _json_type(value: Any) -> str:
    names = {list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def parse_labels(raw: Any, default: Sequence[str] | None) -> list[str] | None:
    """A list (or comma-separated string) of 2..50 distinct, non-empty labels."""
    if raw is None or raw == "" or raw == []:
        return list(default) if default is not None else None
    if isinstance(raw, str):
        raw = [part.strip() for part in raw.split(",") if part.strip()]
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise InputError("labels must be a list of strings")
    # Lengths count as sent, before stripping, as the published schema says.
    if any(len(x) > MAX_LABEL_CHARS for x in raw):
        raise InputError(f"a label is longer than {MAX_LABEL_CHARS} characters")
    labels = [x.strip() for x in raw]
    if any(not x for x in labels):
        raise InputError("labels must not be empty strings")
    for label in labels:
        check_storable(label, "a label")
    if len(labels) < 2 or len(labels) > MAX_LABELS:
        raise InputError(f"labels must name between 2 and {MAX_LABELS} labels, got {len(labels)}")
    if len(set(labels)) != len(labels):
        raise InputError("labels must be distinct")
    return labels


def check_storable(value: str, where: str) -> None:
    """Postgres stores neither NUL characters nor lone surrogates ("\ud800" in JSON)."""
    if "\x00" in value:
        raise InputError(f"{where} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{where} contains an invalid character (a lone surrogate)") from None


def parse_name(value: object, field: str) -> str:
    """An account's or an API key's name, as the admin API and the CLI both take it: a
    non-empty string of at most MAX_NAME_CHARS that Postgres can store and that prints as
    one line (names are shown in tables and logs, where a newline would forge a row),
    without surrounding spaces."""
    from core.obs.logsafe import unprintable

    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{field} must be a non-empty string")
    if len(value) > MAX_NAME_CHARS:
        raise InputError(f"{field} is longer than {MAX_NAME_CHARS} characters")
    check_storable(value, field)
    bad = unprintable(value)
    if bad is not None:
        raise InputError(f"{field} contains an unprintable character ({bad!r})")
    return value.strip()


Row = tuple[str, str, int]  # item id, text, place (a line number, or an index in a list)


@dataclass(frozen=True)
class ItemStream:
    """Validated items as they are read, so a file of any size passes in bounded memory.

    `where` names a place for error messages ("line {}" for files, "items[{}]" for JSON).
    """

    rows: Iterator[Row]
    where: str = "items[{}]"
    # How many rows a body already parsed in memory (JSON) holds, None for a file's: the
    # intake may collect a body's rows and write them in length order itself (db/intake.py
    # `collect_items`); a file's stream through the database in bounded memory.
    in_memory: int | None = None

    def at(self, place: int) -> str:
        return self.where.format(place)


def item_stream(pairs: Iterable[tuple[str, str]]) -> ItemStream:
    """(id, text) pairs already checked by the caller (benchmarks, tests), as a stream."""
    return ItemStream(((item_id, text, n) for n, (item_id, text) in enumerate(pairs)))


def _check_item(item_id: Any, text: Any, place: int, where: str, limits: Limits) -> tuple[str, str]:
    """The item's id (as a string) and text, or InputError naming the place."""
    if type(item_id) is not str or type(text) is not str:
        if item_id is None:
            raise InputError(f"{where.format(place)}: 'id' is missing")
        if text is None:
            raise InputError(f"{where.format(place)}: 'text' is missing")
        if isinstance(item_id, bool) or not isinstance(item_id, (str, int)):
            raise InputError(f"{where.format(place)}: 'id' must be a string or an integer")
        if not isinstance(text, str):
            raise InputError(f"{where.format(place)}: 'text' must be a string")
        item_id = str(item_id)
    if len(item_id) > MAX_ID_CHARS:  # as sent, before stripping
        raise InputError(f"{where.format(place)}: 'id' is longer than {MAX_ID_CHARS} characters")
    item_id = item_id.strip()
    if not item_id:
        raise InputError(f"{where.format(place)}: 'id' is missing or empty")
    if not text or text.isspace():
        raise InputError(f"{where.format(place)}: 'text' is empty")
    if len(text) > limits.max_text_chars:
        raise InputError(
            f"{where.format(place)}: 'text' has {len(text)} characters, more than the limit "
            f"of {limits.max_text_chars} (LANEWAY_MAX_TEXT_CHARS)"
        )
    for field, value in (("id", item_id), ("text", text)):
        # ASCII is the common case and holds no surrogate: skip the encode.
        if "\x00" in value or not value.isascii():
            check_storable(value, f"{where.format(place)}: '{field}'")
    return item_id, text


def _checked(rows: Iterable[tuple[Any, Any, int]], limits: Limits, where: str) -> Iterator[Row]:
    """Check each item as it passes, and the item limit; duplicates are the database's job
    (it sees every id without this process holding them)."""
    count, max_items, max_chars = 0, limits.max_items, limits.max_text_chars
    for item_id, text, place in rows:
        if count >= max_items:
            raise InputError(
                f"{where.format(place)}: more than {max_items} items, the limit per job "
                f"({limits.max_items_setting})"
            )
        count += 1
        # The common case inline (a million lines pass here): plain ASCII strings within
        # the limits. Anything else goes through the full check, which names the problem.
        if type(item_id) is str and type(text) is str and len(item_id) <= MAX_ID_CHARS:
            item_id = item_id.strip()
            if (
                item_id
                and 0 < len(text) <= max_chars
                and item_id.isascii()
                and text.isascii()
                and not text.isspace()
                and "\x00" not in text
                and "\x00" not in item_id
            ):
                yield item_id, text, place
                continue
        yield (*_check_item(item_id, text, place, where, limits), place)


def json_items(raw: Any, limits: Limits) -> ItemStream:
    """Items from a JSON body: a list of {"id": ..., "text": ...} objects."""
    if not isinstance(raw, list):
        raise InputError('\'items\' must be a list of {"id": ..., "text": ...} objects')

    def rows() -> Iterator[tuple[Any, Any, int]]:
        for n, item in enumerate(raw):
            if not isinstance(item, dict):
                raise InputError(f"items[{n}]: must be an object with 'id' and 'text'")
            yield item.get("id"), item.get("text"), n

    return ItemStream(_checked(rows(), limits, "items[{}]"), "items[{}]", in_memory=len(raw))


def text_items(raw: list[Any], limits: Limits, where: str) -> ItemStream:
    """Items from a list of bare texts (OpenAI's `input`), each id its place in the list."""
    rows = ((str(n), text, n) for n, text in enumerate(raw))
    return ItemStream(_checked(rows, limits, where), where, in_memory=len(raw))


def _line_limit(limits: Limits) -> int:
    # A text at the limit, every character escaped as \uXXXX in JSON, plus room for the id.
    return 6 * limits.max_text_chars + 64 * 1024


class _BlankRun:
    """The lines in a row that hold no item: a run past the limits is refused, so a stream
    of nothing (a small gzip file of newlines) costs no more than a file of items would."""

    def __init__(self, limits: Limits) -> None:
        self.max_lines, self.max_chars = limits.max_blank_lines, _line_limit(limits)
        self.lines = self.chars = 0

    def blank(self, number: int, chars: int) -> None:
        self.lines += 1
        self.chars += chars
        if self.lines > self.max_lines:
            raise InputError(
                f"line {number}: more than {self.max_lines} lines in a row without an item "
                f"(blank or whitespace only), the limit (LANEWAY_MAX_BLANK_LINES)"
            )
        if self.chars > self.max_chars:
            raise InputError(
                f"line {number}: the lines in a row without an item hold more than "
                f"{self.max_chars} characters, more than the longest line may "
                "(LANEWAY_MAX_TEXT_CHARS)"
            )

    def item(self) -> None:
        self.lines = self.chars = 0


def _first_line(raw: bytes, gzipped: bool) -> None:
    """Name a compressed content plainly rather than as invalid UTF-8."""
    if raw.startswith(GZIP_MAGIC):
        if gzipped:
            raise InputError(
                "line 1: the content is gzip-compressed again inside the gzip file (nested "
                "gzip): compress it once"
            )
        raise InputError("line 1: the file is gzip-compressed: name it .gz (e.g. items.csv.gz)")


def _lines(stream: BinaryIO, limits: Limits, gzipped: bool) -> Iterator[str]:
    """Decode UTF-8 line by line, so an invalid byte is reported with its line number; no
    line is read whole past the limit, so one endless line cannot exhaust memory."""
    limit = _line_limit(limits)
    number = 0
    try:
        for raw in iter(partial(stream.readline, limit), b""):
            number += 1
            if number == 1:
                _first_line(raw, gzipped)
            if len(raw) >= limit and raw[-1:] != b"\n":
                raise InputError(
                    f"line {number}: longer than {limit} bytes, more than a text of "
                    f"{limits.max_text_chars} characters takes (LANEWAY_MAX_TEXT_CHARS)"
                )
            try:
                # Whole lines: a line break never splits a UTF-8 character.
                line = raw.decode()
            except UnicodeDecodeError as exc:
                if exc.reason == "unexpected end of data" and raw[-1:] != b"\n":
                    raise InputError(
                        f"line {number}: not valid UTF-8 (the file ends mid-character)"
                    ) from None
                raise InputError(f"line {number}: not valid UTF-8") from None
            if number == 1 and line.startswith("\ufeff"):
                line = line[1:]  # a byte-order mark
            yield line
    except EOFError:
        raise TruncatedInput(
            f"line {number + 1}: the gzip file ends early (truncated, or still being written)"
        ) from None
    except (OSError, zlib.error) as exc:
        if not gzipped:
            raise
        raise InputError(f"line {number + 1}: not a valid gzip file ({exc})") from None


def _jsonl_rows(lines: Iterator[str], run: _BlankRun) -> Iterator[tuple[Any, Any, int]]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            run.blank(number, len(line))
            continue
        run.item()
        try:
            # orjson: a fraction of the stdlib's time per line; it also refuses absurd
            # nesting and integers beyond 64 bits.
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"line {number}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise InputError(f"line {number}: must be a JSON object with 'id' and 'text'")
        yield obj.get("id"), obj.get("text"), number


def _csv_rows(lines: Iterator[str], run: _BlankRun) -> Iterator[tuple[Any, Any, int]]:
    reader = csv.reader(lines, strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise InputError("the CSV file is empty")
        columns = [h.strip().lower() for h in header]
        if "id" not in columns or "text" not in columns:
            raise InputError("line 1: the CSV header must name the columns 'id' and 'text'")
        id_col, text_col, width = columns.index("id"), columns.index("text"), len(columns)
        for row in reader:
            if len(row) != width or not (row[id_col].strip() or row[text_col].strip()):
                if not row or all(not cell.strip() for cell in row):
                    # Blank lines between records; a row's characters and its separators.
                    run.blank(reader.line_num, sum(map(len, row)) + len(row) + 1)
                    continue
                if len(row) != width:
                    raise InputError(
                        f"line {reader.line_num}: expected {width} columns, found {len(row)}"
                    )
            run.item()
            yield row[id_col], row[text_col], reader.line_num
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            # The csv module's own cap (131072 by default, process-wide) is above any
            # sensible text limit; name the limit the user can act on.
            raise InputError(
                f"line {reader.line_num}: a field has more than "
                f"{csv.field_size_limit()} characters, more than any text may have "
                "(LANEWAY_MAX_TEXT_CHARS)"
            ) from None
        raise InputError(f"line {reader.line_num}: malformed CSV ({exc})") from None


FILE_TYPES = (".csv", ".jsonl", ".ndjson")


def file_kind(filename: str) -> tuple[str, bool]:
    """("csv" or "jsonl", gzipped?) from a file name; InputError for anything else."""
    name = (filename or "").lower()
    gzipped = name.endswith(".gz")
    if gzipped:
        name = name[:-3]
    if name.endswith(".csv"):
        return "csv", gzipped
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl", gzipped
    raise InputError(
        f"unsupported file type {filename!r}: upload a .csv or .jsonl file (optionally .gz)"
    )


class _Metered(io.RawIOBase):
    """The (inflated) content, a block at a time: fed to a digest when one is given, and
    refused once past `limits.max_bytes`, read no further than one byte beyond it."""

    def __init__(self, inner: BinaryIO, limits: Limits, gzipped: bool, digest: Any) -> None:
        self.inner, self.limits, self.gzipped, self.digest = inner, limits, gzipped, digest
        self.left = limits.max_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer)
        if self.left is not None:
            view = view[: self.left + 1]
        data = self.inner.read(len(view))
        n = len(data)
        view[:n] = data
        if self.left is not None:
            self.left -= n
            if self.left < 0:
                raise InputError(size_error(self.limits, self.gzipped))
        if n and self.digest is not None:
            self.digest.update(view[:n])
        return n


def size_error(limits: Limits, gzipped: bool) -> str:
    """The message for content past `limits.max_bytes`, naming the limit and its setting."""
    what = "the gzip file inflates to" if gzipped else "the file has"
    return f"{what} more than {limits.max_bytes} bytes, the limit of {limits.max_bytes_setting}"


def file_items(filename: str, stream: BinaryIO, limits: Limits, digest: Any = None) -> ItemStream:
    """Items from a CSV (`id,text` columns) or JSONL file, gzipped when its name ends in
    `.gz`; the file is read as the items are consumed. A hashlib `digest` is fed the
    (decompressed) content on the way, so a file is read once."""
    kind, gzipped = file_kind(filename)
    if gzipped:
        stream = gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[assignment]
    if digest is not None or limits.max_bytes is not None:
        metered = _Metered(stream, limits, gzipped, digest)
        stream = io.BufferedReader(metered, 1 << 20)  # type: ignore[assignment]
    lines = _lines(stream, limits, gzipped)
    run = _BlankRun(limits)
    rows = _csv_rows(lines, run) if kind == "csv" else _jsonl_rows(lines, run)
    return ItemStream(_checked(rows, limits, "line {}"), "line {}")
