import pytest

from laneway.inputs import InputError, Limits, parse_bytes, parse_json_items, parse_labels

LIMITS = Limits(max_items=5, max_text_chars=50)


def test_json_items_become_id_text_pairs():
    items = parse_json_items([{"id": 1, "text": "hello"}, {"id": "b", "text": "bye"}], LIMITS)
    assert items == [("1", "hello"), ("b", "bye")]


@pytest.mark.parametrize(
    "items,message",
    [
        ([], "no items"),
        ("nope", "must be a list"),
        ([{"text": "x"}], r"items\[0\]: 'id' is missing"),
        ([{"id": "a", "text": 3}], r"items\[0\]: 'text' must be a string"),
        ([{"id": "a", "text": "  "}], "'text' is empty"),
        ([{"id": "a", "text": "x" * 51}], "LANEWAY_MAX_TEXT_CHARS"),
        ([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}], r"items\[1\]: duplicate id 'a'"),
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
        parse_bytes("x.jsonl", b"[" * 100_000 + b"\n", LIMITS)


def test_a_file_ending_mid_character_is_refused():
    with pytest.raises(InputError, match="ends mid-character"):
        parse_bytes("x.csv", b"id,text\n1,caf\xc3", LIMITS)
