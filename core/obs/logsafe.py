"""Keep secrets out of logs: API keys, Authorization values, URL passwords, webhook URLs.

`install_redaction()` wraps the logging record factory, so every record of every logger
in the process (gunicorn's access and error logs, Flask's, Celery's, ours) is redacted
once, when it is made, whatever handlers and formatters are configured later.
"""

from __future__ import annotations

import logging
import re
import traceback
import unicodedata
from typing import Any

# Each pattern with its needles: fixed strings of which every match holds one (those in
# the second tuple are looked for in the text lowered: the Authorization value's word in
# any case). A text with none of a pattern's needles is not scanned by it: most lines hold
# no secret, and a pattern that may start anywhere scans the whole text, where looking for
# a fixed string costs a fraction of that (the access log writes lines by the thousand a
# second).
REDACTIONS: tuple[tuple[re.Pattern[str], str, tuple[str, ...], tuple[str, ...]], ...] = (
    # An API key keeps its public prefix (it names the key) and loses its secret.
    (re.compile(r"\b(lw_[0-9a-f]{6,16})_[A-Za-z0-9_\-]+"), r"\1_***", ("lw_",), ()),
    # Authorization values ("Basic" only capitalized: the English word is common in logs).
    (
        re.compile(r"\b([Bb][Ee][Aa][Rr][Ee][Rr]|Basic)(\s+)[A-Za-z0-9._~+/\-]{8,}=*"),
        r"\1\2***",
        ("Basic",),
        ("bearer",),
    ),
    # scheme://user:password@host: database and broker URLs.
    (re.compile(r"\b([a-z][a-z0-9+.\-]*://[^/\s:@]*:)[^@\s]+@"), r"\1***@", ("://",), ()),
    # A webhook URL's path and query are its secret (Slack, Teams, signed URLs): keep
    # the scheme and host only.
    (re.compile(r"\b(https?://[^/\s?#\"']+)[/?#][^\s\"']*"), r"\1/***", ("://",), ()),
)


# Control and format characters, line and paragraph separators, lone surrogates (a file
# name's invalid bytes): none may reach a line of output as it is.
UNPRINTABLE = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))


def unprintable(text: str) -> str | None:
    """The first character of `text` that could break or forge a line, or None."""
    if text.isprintable():
        return None
    return next((c for c in text if unicodedata.category(c) in UNPRINTABLE), None)


def printable(text: str) -> str:
    """`text` as it is when it prints on one line, else its repr ('a\\nb'): a name with a
    newline or a carriage return never forges a line of a log, an output or a report."""
    return repr(text) if unprintable(text) is not None else text


def redact(text: str) -> str:
    """The text with every secret-looking part replaced by ***."""
    for pattern, replacement, needles, folded in REDACTIONS:
        if any(n in text for n in needles) or (folded and any(n in text.lower() for n in folded)):
            text = pattern.sub(replacement, text)
    return text


def _redacting_factory(base: Any) -> Any:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = base(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: let the handler report it
            return record
        record.msg, record.args = redact(message), ()
        if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
            # Formatters reuse exc_text when set, so tracebacks are redacted too.
            record.exc_text = redact(
                "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            )
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return record

    factory.laneway_redacting = True  # type: ignore[attr-defined]
    return factory


def install_redaction() -> None:
    """Redact every log record made in this process from now on (idempotent)."""
    current = logging.getLogRecordFactory()
    if not getattr(current, "laneway_redacting", False):
        logging.setLogRecordFactory(_redacting_factory(current))
