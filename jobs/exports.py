"""CSV cells that a spreadsheet would run as a formula are neutralized (OWASP's advice)."""

from __future__ import annotations

import re
from typing import Any

# Spreadsheets treat a cell starting with one of these as a formula (or, for tab and
# carriage return, strip them and look again).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# A plain decimal number, which a spreadsheet reads as a number and never as a formula.
PLAIN_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def spreadsheet_safe(value: Any) -> Any:
    """The value for a CSV cell: numbers as they are, text starting like a formula with a
    leading apostrophe (so "=1+2" shows as text, "-0.5" stays the number -0.5)."""
    if isinstance(value, bool) or not isinstance(value, str):
        return value
    if value.startswith(FORMULA_STARTS) and not PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value
