"""The pattern extractor: each entity type, the look-alikes it must skip, exact offsets."""

import pytest

from inference.patterns import PATTERN_TYPES, extract_patterns


def found(text: str, kind: str | None = None) -> list[str]:
    return [e["text"] for e in extract_patterns(text) if kind is None or e["type"] == kind]


def check_invariants(text: str) -> list[dict]:
    entities = extract_patterns(text)
    for e in entities:
        assert e["text"] == text[e["start"] : e["end"]]
        assert e["source"] == "pattern"
        assert e["type"] in PATTERN_TYPES
    for a, b in zip(entities, entities[1:], strict=False):
        assert a["start"] <= b["start"]
        assert a["end"] <= b["start"], f"{a} overlaps {b}"
    return entities


@pytest.mark.parametrize(
    "text, expected",
    [
        ("write to john.doe+shop@example.co.uk today", "john.doe+shop@example.co.uk"),
        ("Email: support@acme-corp.com.", "support@acme-corp.com"),
        ("mailto:a_b@mail.example.org", "a_b@mail.example.org"),
    ],
)
def test_email(text, expected):
    assert found(text, "email") == [expected]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("see https://example.com/path?q=1&x=2 now", "https://example.com/path?q=1&x=2"),
        ("go to http://shop.example.org.", "http://shop.example.org"),
        ("visit www.example.com/deals, thanks", "www.example.com/deals"),
        ("(details at https://example.com/a)", "https://example.com/a"),
        ("is it https://example.com/faq?!", "https://example.com/faq"),
        ("list: https://example.com/x; more", "https://example.com/x"),
        (
            "wiki https://en.wikipedia.org/wiki/Foo_(bar) ok",
            "https://en.wikipedia.org/wiki/Foo_(bar)",
        ),
    ],
)
def test_url_keeps_trailing_punctuation_out(text, expected):
    assert found(text, "url") == [expected]


def test_email_domain_is_not_also_a_url():
    text = "Mail john@www.example.com or see www.example.com."
    entities = check_invariants(text)
    assert [(e["type"], e["text"]) for e in entities] == [
        ("email", "john@www.example.com"),
        ("url", "www.example.com"),
    ]


def test_url_with_credentials_is_one_url():
    assert [(e["type"], e["text"]) for e in extract_patterns("http://user@host.com/x")] == [
        ("url", "http://user@host.com/x")
    ]


@pytest.mark.parametrize(
    "phone",
    [
        "+1 555 123 4567",
        "(555) 123-4567",
        "555-123-4567",
        "555.123.4567",
        "07700 900123",
        "+44 (0)20 7946 0958",
        "+14155551234",
        "1-800-555-1234",
    ],
)
def test_phone(phone):
    text = f"Call me on {phone}, please."
    assert found(text, "phone") == [phone]


@pytest.mark.parametrize(
    "text",
    [
        "Order #467742 has not arrived",
        "order 467742 and ticket 12345678",
        "running version 2.3.1 of the app",
        "server 10.0.0.1 is down",
        "open from 2019-2024",
        "paid 1234567.89 in total",
        "we have 42 items and 7 boxes",
    ],
)
def test_phone_negatives(text):
    assert found(text, "phone") == []


def test_phone_does_not_swallow_the_next_number():
    assert found("call 555-123-4567 24 hours a day", "phone") == ["555-123-4567"]


@pytest.mark.parametrize(
    "money",
    ["$49.99", "$1,200", "€30", "30 EUR", "USD 12.50", "£5", "US$ 5", "20 dollars", "$2.5m"],
)
def test_money(money):
    text = f"The total was {money}."
    assert found(text, "money") == [money]


def test_money_negatives():
    assert found("order #467742, version 2.3.1, 42 items", "money") == []


@pytest.mark.parametrize(
    "date",
    [
        "2024-06-11",
        "11/06/2024",
        "06-11-24",
        "11.06.2024",
        "June 11, 2024",
        "11 June 2024",
        "Jun 11",
        "11th of June",
        "Tuesday, June 11th, 2024",
        "June 2024",
    ],
)
def test_date(date):
    text = f"It shipped on {date} from the warehouse."
    assert found(text, "date") == [date]


@pytest.mark.parametrize(
    "text",
    [
        "version 2.3.1 released",
        "version 2.3.10 released",
        "on 13/13/2024",
        "you may 5 times",
        "Order #467742",
        "The Mayor 12 said",
    ],
)
def test_date_negatives(text):
    assert found(text, "date") == []


def test_mixed_text_offsets_and_order():
    text = (
        "Hi, order #467742 (placed 2024-06-11) cost $49.99. Call +1 555 123 4567 or write to "
        "help@shop.example.com; tracking at https://shop.example.com/t/467742."
    )
    entities = check_invariants(text)
    assert [(e["type"], e["text"]) for e in entities] == [
        ("date", "2024-06-11"),
        ("money", "$49.99"),
        ("phone", "+1 555 123 4567"),
        ("email", "help@shop.example.com"),
        ("url", "https://shop.example.com/t/467742"),
    ]
    first = entities[0]
    assert (first["start"], first["end"]) == (text.index("2024"), text.index("2024") + 10)


def test_empty_and_plain_text():
    assert extract_patterns("") == []
    assert extract_patterns("the food was great and the staff were kind") == []


def test_no_overlaps_on_dense_text():
    text = " ".join(
        [
            "x@y.com",
            "www.y.com",
            "$5",
            "5 EUR",
            "2024-01-02",
            "555-123-4567",
            "Jan 2, 2024",
            "(555) 123-4567",
            "https://a.b/c.",
        ]
        * 3
    )
    entities = check_invariants(text)
    assert {e["type"] for e in entities} == set(PATTERN_TYPES)
