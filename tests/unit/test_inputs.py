import gzip
import io
import re
import time
import tracemalloc

import pytest

from jobs.inputs import InputError, Limits, file_items, json_items, parse_labels
from tests import bombs

LIMITS = Limits(max_items=5, max_text_chars=50)


def parse_json_items(raw, limits):
    return [(i, t) for i, t, _ in json_items(raw, limits).rows]


def parse_bytes(filename, data, limits):
    return [(i, t) for i, t, _ in file_items(filename, io.BytesIO(data), limits).rows]


def test_json_items_become_id_text_pairs():
    items = parse_json_items([{"id": 1, "text": "hello"}, {"id": "b", "text": "bye"}], LIMITS)
    assert items == [("1", "hello"), ("b", "bye")]


@pytest.mark.parametrize(
    "items,message",
    [
        ("nope", "must be a list"),
        ([{"text": "x"}], r"items\[0\]: 'id' is missing"),
        ([{"id": "a", "text": 3}], r"items\[0\]: 'text' must be a string"),
        ([{"id": "a", "text": "  "}], "'text' is empty"),
        ([{"id": "a", "text": "x" * 51}], "LANEWAY_MAX_TEXT_CHARS"),
        ([{"id": str(i), "text": "x"} for i in range(6)], "LANEWAY_MAX_ITEMS"),
        ([["a", "b"]], "must be an object"),
        ([{"id": True, "text": "x"}], "'id' must be a string"),
    ],
)
def test_bad_json_items_are_named(items, message):
    with pytest.raises(InputError, match=message):
        parse_json_items(items, LIMITS)


def test_csv_with_quotes_commas_and_newlines():
    data = b'id,text\r\n1,"a, b"\r\n2,"say ""hi""\nthere"\r\n'
    assert parse_bytes("x.csv", data, LIMITS) == [("1", "a, b"), ("2", 'say "hi"\nthere')]


def test_csv_errors_name_the_line():
    with pytest.raises(InputError, match="line 1: the CSV header"):
        parse_bytes("x.csv", b"name,body\n1,x\n", LIMITS)
    with pytest.raises(InputError, match="line 3: expected 2 columns"):
        parse_bytes("x.csv", b"id,text\n1,x\n2,y,z\n", LIMITS)
    with pytest.raises(InputError, match="line 2: not valid UTF-8"):
        parse_bytes("x.csv", b"id,text\n1,\xff\xfe\n", LIMITS)


def test_jsonl_errors_name_the_line():
    with pytest.raises(InputError, match="line 2: not valid JSON"):
        parse_bytes("x.jsonl", b'{"id": 1, "text": "a"}\n{oops\n', LIMITS)
    with pytest.raises(InputError, match="line 1: must be a JSON object"):
        parse_bytes("x.jsonl", b"[1, 2]\n", LIMITS)
    assert parse_bytes("x.jsonl", b'{"id": 1, "text": "a"}\n\n', LIMITS) == [("1", "a")]


def test_unknown_file_type():
    with pytest.raises(InputError, match="unsupported file type"):
        parse_bytes("x.xlsx", b"", LIMITS)


def test_labels():
    assert parse_labels(None, ["a", "b"]) == ["a", "b"]
    assert parse_labels("x, y", ["a", "b"]) == ["x", "y"]
    for bad in (["x"], ["x", "x"], ["x", ""], [1, 2], "x"):
        with pytest.raises(InputError):
            parse_labels(bad, ["a", "b"])


def test_utf8_bom_is_accepted():
    assert parse_bytes("f.csv", "\ufeffid,text\n1,caf\u00e9\n".encode(), LIMITS) == [
        ("1", "caf\u00e9")
    ]


@pytest.mark.parametrize(
    "items,message",
    [
        ([{"id": "a", "text": "x\ud800"}], r"items\[0\]: 'text' contains an invalid character"),
        ([{"id": "a\ud800", "text": "x"}], r"items\[0\]: 'id' contains an invalid character"),
        ([{"id": "a\x00", "text": "x"}], r"items\[0\]: 'id' contains a NUL"),
        ([{"id": "a", "text": "x\x00y"}], r"items\[0\]: 'text' contains a NUL"),
    ],
)
def test_text_postgres_cannot_store_is_refused(items, message):
    with pytest.raises(InputError, match=message):
        parse_json_items(items, LIMITS)
    with pytest.raises(InputError, match="a label contains"):
        parse_labels(["ok", "bad\ud800"], ["a", "b"])


def test_absurd_jsonl_lines_are_input_errors():
    with pytest.raises(InputError, match="line 1: not valid JSON"):
        parse_bytes("x.jsonl", b'{"id": ' + b"9" * 5000 + b', "text": "x"}\n', LIMITS)
    with pytest.raises(InputError, match="line 1: not valid JSON"):
        parse_bytes("x.jsonl", b"[" * 100_000 + b"\n", Limits(5, max_text_chars=20_000))


def test_a_file_ending_mid_character_is_refused():
    with pytest.raises(InputError, match="ends mid-character"):
        parse_bytes("x.csv", b"id,text\n1,caf\xc3", LIMITS)


@pytest.mark.parametrize(
    "data,message",
    [
        (b"", r"not a valid JSON object: Expecting value \(line 1, column 1\)"),
        (b'{"items": [}', r"line 1, column 12"),
        (b'{"items": "\xff"}', r"not valid UTF-8 \(byte 11\)"),
        (b"[1, 2]", "must be a JSON object, not a JSON array"),
        (b'"items"', "not a JSON string"),
        (b"null", "not a JSON null"),
        (b"1" * 5000, "not a valid JSON object"),
        (b"[" * 100_000, "nested too deeply"),
        (b'{"items": [], "lables": ["a"]}', "unknown field 'lables'; known fields: items, labels"),
    ],
)
def test_json_body_problems_are_named(data, message):
    from jobs.inputs import parse_json_body

    with pytest.raises(InputError, match=message):
        parse_json_body(data, ("items", "labels"))


def test_json_body_in_utf16_is_read():
    from jobs.inputs import parse_json_body

    assert parse_json_body('{"items": "é"}'.encode("utf-16"), ("items",)) == {"items": "é"}


def test_item_limit_message_names_the_account_types_setting():
    limits = Limits(max_items=1, max_text_chars=50, max_items_setting="LANEWAY_MAX_ITEMS_DEMO")
    with pytest.raises(InputError, match=r"items\[1\]: more than 1 items.*LANEWAY_MAX_ITEMS_DEMO"):
        parse_json_items([{"id": "a", "text": "x"}, {"id": "b", "text": "y"}], limits)


def test_items_are_read_lazily_with_their_places():
    """Nothing is read until the rows are consumed; each row carries its line."""
    stream = io.BytesIO(b'id,text\n1,a\n\n2,"two\nlines"\n3,c\n')
    items = file_items("x.csv", stream, LIMITS)
    assert stream.tell() == 0
    assert list(items.rows) == [("1", "a", 2), ("2", "two\nlines", 5), ("3", "c", 6)]
    assert items.at(5) == "line 5"
    assert json_items([{"id": 1, "text": "a"}], LIMITS).at(0) == "items[0]"


def test_gzipped_files_are_read_through():
    data = gzip.compress(b'{"id": "a", "text": "hello"}\n{"id": "b", "text": "bye"}\n')
    assert parse_bytes("x.jsonl.gz", data, LIMITS) == [("a", "hello"), ("b", "bye")]
    assert parse_bytes("X.CSV.GZ", gzip.compress(b"id,text\n1,a\n"), LIMITS) == [("1", "a")]


def test_truncated_and_corrupt_gzip_files_are_input_errors():
    data = gzip.compress(b"".join(b'{"id": "%d", "text": "x"}\n' % i for i in range(3)))
    with pytest.raises(InputError, match="gzip file ends early"):
        parse_bytes("x.jsonl.gz", data[:-10], LIMITS)
    with pytest.raises(InputError, match="line 1: not a valid gzip file"):
        parse_bytes("x.csv.gz", b"id,text\n1,a\n", LIMITS)


def test_the_item_limit_names_its_setting():
    limits = Limits(max_items=2, max_text_chars=50, max_items_setting="LANEWAY_INBOX_MAX_ITEMS")
    with pytest.raises(InputError, match="line 4: more than 2 items.*LANEWAY_INBOX_MAX_ITEMS"):
        parse_bytes("x.csv", b"id,text\n1,a\n2,b\n3,c\n", limits)


def test_an_endless_line_is_refused_without_reading_it_whole():
    limits = Limits(max_items=5, max_text_chars=10)
    with pytest.raises(InputError, match="line 2: longer than"):
        parse_bytes("x.jsonl", b'{"id": 1, "text": "a"}\n' + b"x" * 200_000, limits)


# --- compressed input costs what it would cost uncompressed -------------------------------

BOUNDED = Limits(
    max_items=100,
    max_text_chars=20_000,
    max_items_setting="LANEWAY_MAX_ITEMS_DEMO",
    max_bytes=1 << 20,
    max_bytes_setting="LANEWAY_MAX_UPLOAD_BYTES_DEMO",
)


@pytest.mark.parametrize("name", sorted(bombs.NOTHING))
def test_a_small_gzip_file_of_nothing_is_refused_at_once_in_bounded_memory(name):
    data = bombs.nothing(name)
    assert len(data) < bombs.MIB  # within the demo account's upload limit, as sent
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(InputError) as refused:
            parse_bytes(name, data, BOUNDED)
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 200 MiB inflated if read to its end: far less is read, and far less held.
    assert seconds < 5, seconds
    assert peak < 16 * bombs.MIB, peak
    message = str(refused.value)
    assert re.match(r"line \d+: ", message), message
    assert "LANEWAY_MAX_BLANK_LINES" in message or "LANEWAY_MAX_TEXT_CHARS" in message


def test_the_run_of_lines_without_an_item_has_a_bound_of_its_own():
    limits = Limits(max_items=5, max_text_chars=50, max_blank_lines=3)
    # Blank lines between items are fine up to the bound: each item starts a new run.
    rows = b'{"id": "a", "text": "x"}\n\n \n\t\n{"id": "b", "text": "y"}\n\n\n\n'
    assert parse_bytes("x.jsonl", rows, limits) == [("a", "x"), ("b", "y")]
    # Line 5 is the fourth in a row without an item.
    with pytest.raises(InputError, match=r"line 5: more than 3 lines in a row without an item"):
        parse_bytes("x.jsonl", b'{"id": "a", "text": "x"}\n' + b"  \n" * 5, limits)
    with pytest.raises(InputError, match=r"line 6: more than 3 lines.*LANEWAY_MAX_BLANK_LINES"):
        parse_bytes("x.csv", b"id,text\n1,a\n,\n \n\n ,  \n2,b\n", limits)
    # Uncompressed, the same file is refused the same way.
    with pytest.raises(InputError, match="LANEWAY_MAX_BLANK_LINES"):
        parse_bytes("x.jsonl", b"\n" * 10, limits)


def test_inflated_bytes_are_held_to_the_upload_limit_naming_it():
    texts = b"".join(b'{"id": "%d", "text": "%s"}\n' % (i, b"a" * 19_000) for i in range(60))
    assert len(texts) > BOUNDED.max_bytes and len(gzip.compress(texts)) < 10_000
    message = (
        "the gzip file inflates to more than 1048576 bytes, the limit of "
        "LANEWAY_MAX_UPLOAD_BYTES_DEMO"
    )
    with pytest.raises(InputError, match=message):
        parse_bytes("x.jsonl.gz", gzip.compress(texts), BOUNDED)
    # At the limit exactly, the file is read through.
    exact = texts[: BOUNDED.max_bytes]
    exact = exact[: exact.rindex(b"\n") + 1]
    padded = exact + b"\n" * (BOUNDED.max_bytes - len(exact))
    assert len(parse_bytes("x.jsonl.gz", gzip.compress(padded), BOUNDED)) == exact.count(b"\n")


def test_the_byte_limit_reads_one_byte_past_it_and_no_further():
    stream = io.BytesIO(b"id,text\n" + b"1," + b"a" * 40 + b"\n" + b"x" * 10_000)
    limits = Limits(5, 100, max_bytes=50, max_bytes_setting="LANEWAY_INBOX_MAX_BYTES")
    with pytest.raises(InputError, match="the file has more than 50 bytes.*INBOX_MAX_BYTES"):
        list(file_items("x.csv", stream, limits).rows)
    assert stream.tell() == 51


@pytest.mark.parametrize(
    "filename,data,message",
    [
        (
            "x.csv.gz",
            bombs.nested(b"id,text\n1,a\n"),
            "line 1: the content is gzip-compressed again",
        ),
        ("x.csv", gzip.compress(b"id,text\n1,a\n"), "line 1: the file is gzip-compressed"),
        (
            "x.jsonl.gz",
            bombs.with_trailing_garbage(b'{"id": 1, "text": "a"}\n'),
            "not a valid gzip",
        ),
        ("x.jsonl.gz", bombs.truncated(b'{"id": 1, "text": "a"}\n' * 50), "gzip file ends early"),
        ("x.csv.gz", gzip.compress(b"id,text\n")[:10] + b"\xff" * 20, "not a valid gzip file"),
        ("x.csv.gz", b"", "the CSV file is empty"),
    ],
    ids=bombs.stable_id,
)
def test_broken_gzip_files_are_named(filename, data, message):
    with pytest.raises(InputError, match=re.escape(message)):
        parse_bytes(filename, data, BOUNDED)
