"""Pattern-based extraction of well-formed entities: emails, URLs, phones, money, dates."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

_EMAIL = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@"
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,}(?![\w-])"
)

# Greedy up to whitespace, quotes or angle brackets; trailing punctuation is trimmed after.
_URL = re.compile(
    r"(?:(?<![\w.+-])https?://|(?<![\w.@/-])www\.)[\w-][^\s<>\"'\u201c\u201d\u2018\u2019]*",
    re.IGNORECASE,
)
_URL_TRAILING = ".,;:!?)]}*"

# "+CC" and "(area)" prefixes, then digit groups: spaces first, then hyphens or dots, so a
# number after "555-123-4567" ("... 24 hours") is not taken as one more group. The
# look-behind keeps order numbers (#467742), amounts, paths and longer numbers out.
_PHONE = re.compile(
    r"(?<![\w+#$€£/.,-])"
    r"(?:\+\d{7,15}"
    r"|(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?|\(\d{2,5}\)[ .-]?|1[-.](?=\d{3}[-.]))?"
    r"\d{2,5}(?: \d{2,8})*(?:[.-]\d{2,8})*)"
    r"(?![\w/]|[.,-]\d)"
)
_DATE_LIKE = re.compile(r"^(?:\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{2,4})$")
_IPV4_LIKE = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")
_YEAR_RANGE = re.compile(r"^(?:19|20)\d{2}\s*-\s*(?:19|20)\d{2}$")

_AMOUNT = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d{1,2})?"
_SYMBOL = r"(?:(?:US|CA|AU|NZ|HK|[CAS])?\$|€|£|¥|₹)"
_CODE = r"(?:USD|EUR|GBP|JPY|CHF|CAD|AUD|NZD|CNY|INR|SEK|NOK|DKK|PLN)"
_SCALE = r"(?:\s?(?:k|m|bn|million|billion)\b)?"
_MONEY = re.compile(
    rf"(?<![\w.,])(?:{_SYMBOL}\s?{_AMOUNT}{_SCALE}"
    rf"|{_CODE}\s?{_AMOUNT}{_SCALE}"
    rf"|{_AMOUNT}{_SCALE}\s?(?:{_SYMBOL}|{_CODE}\b|(?i:dollars?|euros?)\b))"
    r"(?![\d]|[.,]\d)"
)

# Month names are matched capitalized only: "may 5" in running text is rarely a date.
_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
_WEEKDAY = r"(?:(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day,?\s+)?"
_DAY = r"(?:0?[1-9]|[12]\d|3[01])(?:st|nd|rd|th)?"
_YEAR = r"(?:19|20)\d{2}"
_DATE = re.compile(
    r"(?<![\w./-])(?:"
    r"\d{4}-(?:0?[1-9]|1[0-2])-(?:0?[1-9]|[12]\d|3[01])"  # 2024-06-11
    r"|\d{4}/(?:0?[1-9]|1[0-2])/(?:0?[1-9]|[12]\d|3[01])"  # 2024/06/11
    r"|\d{1,2}[/-]\d{1,2}[/-](?:\d{4}|\d{2})"  # 11/06/2024, 06-11-24
    r"|\d{1,2}\.\d{1,2}\.\d{4}"  # 11.06.2024 (a 2-digit year here reads as a version)
    rf"|{_WEEKDAY}{_MONTH}\s+{_DAY}(?:,?\s+{_YEAR})?"  # June 11, 2024 / Jun 11
    rf"|{_WEEKDAY}{_DAY}\s+(?:of\s+)?{_MONTH}(?:,?\s+{_YEAR})?"  # 11 June 2024
    rf"|{_MONTH}\s+{_YEAR}"  # June 2024
    r")(?![\w/]|[.-]\d)"
)
_NUMERIC_DATE = re.compile(r"^(\d{1,4})[-/.](\d{1,2})[-/.](\d{1,4})$")


def _emails(text: str) -> Iterator[tuple[int, int]]:
    for m in _EMAIL.finditer(text):
        yield m.span()


def _urls(text: str) -> Iterator[tuple[int, int]]:
    for m in _URL.finditer(text):
        start, end = m.span()
        while end > start and text[end - 1] in _URL_TRAILING:
            # A closing parenthesis that closes one inside the URL (wiki links) belongs to it.
            if text[end - 1] == ")" and text.count("(", start, end) >= text.count(")", start, end):
                break
            end -= 1
        if re.search(r"(?://|www\.)[\w-]", text[start:end], re.IGNORECASE):
            yield start, end


def _phones(text: str) -> Iterator[tuple[int, int]]:
    for m in _PHONE.finditer(text):
        candidate = m.group()
        digits = sum(ch.isdigit() for ch in candidate)
        if not 7 <= digits <= 15:
            continue
        # A bare run of digits is an id or an amount, not a phone number.
        if not re.search(r"[+( .-]", candidate):
            continue
        if _DATE_LIKE.match(candidate) or _IPV4_LIKE.match(candidate):
            continue
        if _YEAR_RANGE.match(candidate):
            continue
        # Dots alone make decimals (1234567.89); dotted phones have three or more groups.
        if re.fullmatch(r"[\d.]+", candidate) and candidate.count(".") < 2:
            continue
        yield m.span()


def _money(text: str) -> Iterator[tuple[int, int]]:
    for m in _MONEY.finditer(text):
        yield m.span()


def _valid_numeric_date(candidate: str) -> bool:
    m = _NUMERIC_DATE.match(candidate)
    if not m:
        return True  # a month-name date, already checked by the pattern
    a, b = int(m.group(1)), int(m.group(2))
    if len(m.group(1)) == 4:
        return True  # year first: month and day ranges are in the pattern
    # Day/month order is ambiguous (11/06 vs 06/11): one of them must be a month.
    return 1 <= a <= 31 and 1 <= b <= 31 and (a <= 12 or b <= 12)


def _dates(text: str) -> Iterator[tuple[int, int]]:
    for m in _DATE.finditer(text):
        if _valid_numeric_date(m.group()):
            yield m.span()


_EXTRACTORS: dict[str, Callable[[str], Iterator[tuple[int, int]]]] = {
    "email": _emails,
    "url": _urls,
    "date": _dates,
    "money": _money,
    "phone": _phones,
}
PATTERN_TYPES: tuple[str, ...] = tuple(_EXTRACTORS)


def extract_patterns(text: str) -> list[dict[str, Any]]:
    """Non-overlapping pattern entities sorted by start; `text[start:end]` is each one's text."""
    candidates = [
        (start, end, rank, kind)
        for rank, (kind, find) in enumerate(_EXTRACTORS.items())
        for start, end in find(text)
        if end > start
    ]
    # Longest first, then earliest, then the type order above (an email before the URL
    # that matches its domain); overlapping losers are dropped.
    candidates.sort(key=lambda c: (-(c[1] - c[0]), c[0], c[2]))
    taken: list[tuple[int, int, str]] = []
    for start, end, _, kind in candidates:
        if all(end <= s or start >= e for s, e, _ in taken):
            taken.append((start, end, kind))
    taken.sort()
    return [
        {"type": kind, "text": text[start:end], "start": start, "end": end, "source": "pattern"}
        for start, end, kind in taken
    ]
