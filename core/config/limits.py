"""What each account type may do by default (core/config/settings.py reads them, under
the fleet-wide ceilings and the LANEWAY_<LIMIT>_<TYPE> variables)."""

from __future__ import annotations

from dataclasses import dataclass

from core.vocab import MIB


@dataclass(frozen=True)
class AccountLimits:
    """What one account type may do: requests per window, items per job, bytes per request."""

    rate_limit: str
    max_items: int
    max_upload_bytes: int


# Per account type; None means the fleet-wide ceiling (LANEWAY_MAX_ITEMS and
# LANEWAY_MAX_UPLOAD_BYTES). Demo and trial users come from the internet: keep them small.
DEFAULT_ACCOUNT_LIMITS: dict[str, tuple[str, int | None, int | None]] = {
    "demo": ("60/minute", 100, 1 * MIB),
    "trial": ("300/minute", 1_000, 8 * MIB),
    "standard": ("1000/minute", None, None),
    "enterprise": ("5000/minute", None, None),
}
