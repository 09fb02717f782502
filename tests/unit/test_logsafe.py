import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.obs.logsafe import REDACTIONS, install_redaction, printable, redact

KEY = "lw_0123456789ab_Zx9-Qw_ErTy-uiop_ASDFghjkl1234567890abcd"


@pytest.mark.parametrize(
    "text,secret,kept",
    [
        (f"login with {KEY} failed", "Zx9-Qw", "lw_0123456789ab_***"),
        ("Authorization: Bearer sometoken.abc/def=", "sometoken", "Bearer ***"),
        ("authorization: bearer sometoken.abc", "sometoken", "bearer ***"),
        ("Authorization: Basic bHdfYWJjOnNlY3JldA==", "bHdfYWJj", "Basic ***"),
        ("postgresql+psycopg://laneway:s3cr3t@db:5432/laneway", "s3cr3t", "laneway:***@db"),
        ("redis://:s3cr3t@cache:6379/0", "s3cr3t", "redis://:***@cache"),
        (
            "webhook https://hooks.slack.com/services/T000/B000/XXXXsecret failed",
            "XXXXsecret",
            "https://hooks.slack.com/***",
        ),
        ("posting to https://example.com/hook?token=abc123", "abc123", "https://example.com/***"),
    ],
)
def test_redact_hides_the_secret_and_keeps_what_identifies_it(text, secret, kept):
    out = redact(text)
    assert secret not in out and kept in out


@pytest.mark.parametrize(
    "line",
    [
        '127.0.0.1 "GET /v1/jobs/3f2b HTTP/1.1" 200 512 redis://cache:6379/0',
        "the token expired; basic checks passed; listening at http://127.0.0.1:8000",
        "chunk 12 of job 3f2b failed after 3 attempts (lw_0123456789ab)",
    ],
)
def test_text_without_secrets_is_unchanged(line):
    assert redact(line) == line


def every_pattern(text: str) -> str:
    """Redaction as every pattern applied to the whole text, needles or not."""
    for pattern, replacement, _, _ in REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


# Pieces of a line: secrets of each kind, their words in odd cases and halves, separators,
# a few non-ASCII letters (some change length when lowered), and free text.
PIECES = st.sampled_from(
    [KEY, "lw_", "lw_abc", "lw_fedcba98_Sec-ret", "_", "Bearer", "BeArEr", "bEARER", "bearer",
     "Basic", "basic", "BASIC", " ", "\t", "abcdefgh1234", "dXNlcjpwYXNzd29yZA==", "://", "https://",
     "http://h", "redis://:pw@", "postgresql://u:p@db/x", "/path?token=x", "@", ":", '"',
     "İ", "K", "ß", "\n"]
)  # fmt: skip


@given(st.lists(st.one_of(PIECES, st.text(max_size=8)), max_size=12).map("".join))
def test_the_needles_never_skip_a_secret(text):
    """A pattern is skipped only where it could not match: the redacted text is the one
    every pattern over the whole text gives."""
    assert redact(text) == every_pattern(text)


def test_every_logger_is_redacted_whatever_its_handler(caplog):
    install_redaction()
    install_redaction()  # idempotent: one wrapper, not two
    log = logging.getLogger("laneway.test.somewhere")
    with caplog.at_level(logging.INFO):
        log.info("key %s", KEY)
        # gunicorn's access log formats a dict of atoms
        log.info('%(h)s "%(r)s"', {"h": "10.0.0.1", "r": f"GET /x?api_key={KEY} HTTP/1.1"})
        try:
            raise RuntimeError(f"could not connect to redis://:pw-{KEY[-8:]}@cache/0")
        except RuntimeError:
            log.exception("failed with %s", "Bearer abc.defghij")
    text = caplog.text
    assert "Zx9-Qw" not in text and KEY[-8:] not in text and "abc.defghij" not in text
    assert "lw_0123456789ab_***" in text and "redis://:***@cache/0" in text
    assert '10.0.0.1 "GET /x?api_key=lw_0123456789ab_*** HTTP/1.1"' in text
    assert "Traceback" in text  # the traceback is still there, redacted


@pytest.mark.parametrize(
    "text,shown",
    [
        ("orders.csv", "orders.csv"),
        ("résumé 2024.csv", "résumé 2024.csv"),
        ("a\nb.csv", "'a\\nb.csv'"),
        ("a\rb.csv", "'a\\rb.csv'"),
        ("esc\x1b[2K.csv", "'esc\\x1b[2K.csv'"),
        ("sep\u2028.csv", "'sep\\u2028.csv'"),
        ("rlo\u202egnp.csv", "'rlo\\u202egnp.csv'"),
        ("bad-\udcff.csv", "'bad-\\udcff.csv'"),
    ],
)
def test_printable_escapes_whatever_could_break_a_line(text, shown):
    assert printable(text) == shown
    assert len(printable(text).splitlines()) == 1
