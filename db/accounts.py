"""Accounts and their API keys: creation, look-up by key (hashed, compared in constant
time), rotation and revocation."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.config.settings import Settings
from db.common import aware, utcnow
from db.models import Account, ApiKey

KEY_PREFIX = "lw_"
KEY_PREFIX_SHAPE = re.compile(r"lw_[0-9a-f]{1,13}")
# An account's own fair-share weight (jobs/fairshare.py). The floor keeps the items a
# chunk adds to its pass (items over weight) far from overflow: an infinite pass would
# become the lane's clock and undo every account's order.
MIN_SHARE_WEIGHT = 0.001
MAX_SHARE_WEIGHT = 1000
SHARE_WEIGHT_RULE = (
    f"share_weight must be a number from {MIN_SHARE_WEIGHT} to {MAX_SHARE_WEIGHT}, "
    "or null for the account type's weight"
)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_account(
    session: Session,
    name: str,
    type_: str,
    *,
    is_admin: bool = False,
    key_name: str | None = None,
) -> tuple[Account, str]:
    """Create an account with one API key; the key is returned once and stored hashed."""
    account = Account(name=name, type=type_, is_admin=is_admin)
    session.add(account)
    session.flush()
    return account, add_api_key(session, account, key_name)[1]


def add_api_key(session: Session, account: Account, name: str | None = None) -> tuple[ApiKey, str]:
    """A new key for the account: the row, and the key itself (shown once, never stored)."""
    # lw_ + 12 hex: 48 bits, so prefixes stay unique across millions of keys.
    prefix = KEY_PREFIX + secrets.token_hex(6)
    key = f"{prefix}_{secrets.token_urlsafe(32)}"
    row = ApiKey(account_id=account.id, prefix=prefix, key_hash=hash_key(key), name=name)
    session.add(row)
    session.flush()
    return row, key


def key_prefix(key: str) -> str | None:
    """The public prefix of a key (lw_<hex>), or None when it is not shaped like one."""
    # lw_<hex>_<secret>: the secret itself may contain underscores.
    parts = key.split("_", 2)
    if len(parts) != 3 or not parts[2]:
        return None
    prefix = f"{parts[0]}_{parts[1]}"
    # Anything else never reaches the database (a NUL in a query is an error, not a miss).
    return prefix if KEY_PREFIX_SHAPE.fullmatch(prefix) else None


def is_live(row: ApiKey, now: datetime | None = None) -> bool:
    """A key is live until its revocation moment, which rotation may set in the future."""
    return row.revoked_at is None or aware(row.revoked_at) > (now or utcnow())


def live_key(session: Session, key: str) -> ApiKey | None:
    """The live key row matching a key, or None; compares hashes in constant time."""
    prefix = key_prefix(key)
    if prefix is None:
        return None
    row = session.scalar(select(ApiKey).where(ApiKey.prefix == prefix))
    if row is None or not hmac.compare_digest(row.key_hash, hash_key(key)) or not is_live(row):
        return None
    return row


def account_for_key(session: Session, key: str) -> Account | None:
    """The account owning a live key, or None."""
    row = live_key(session, key)
    return row.account if row is not None else None


def list_accounts(session: Session) -> list[Account]:
    return list(session.scalars(select(Account).order_by(Account.id)))


def find_account(session: Session, ref: str) -> Account | None:
    """An account by its name, or by its id when `ref` is all digits."""
    if ref.isdigit():
        return session.get(Account, int(ref))
    return session.scalar(select(Account).where(Account.name == ref))


def list_keys(session: Session, account_id: int) -> list[ApiKey]:
    return list(
        session.scalars(select(ApiKey).where(ApiKey.account_id == account_id).order_by(ApiKey.id))
    )


def find_key(session: Session, prefix: str) -> ApiKey | None:
    """The key with this prefix, revoked or not; None for anything not shaped like one."""
    if not KEY_PREFIX_SHAPE.fullmatch(prefix):
        return None
    return session.scalar(select(ApiKey).where(ApiKey.prefix == prefix))


def revoke_key(session: Session, row: ApiKey, grace_seconds: int = 0) -> None:
    """Revoke a key now, or after a grace period; an earlier revocation stands."""
    at = utcnow() + timedelta(seconds=grace_seconds)
    if row.revoked_at is None or aware(row.revoked_at) > at:
        row.revoked_at = at
    session.flush()


def rotate_key(session: Session, row: ApiKey, grace_seconds: int = 0) -> tuple[ApiKey, str]:
    """Replace a key: a new one for the same account and name, the old one revoked after
    the grace period (0: at once)."""
    new_row, key = add_api_key(session, row.account, row.name)
    revoke_key(session, row, grace_seconds)
    return new_row, key


def share_weight(value: object) -> float | None:
    """An account's own fair-share weight as an operator gives it: None (its type's), or a
    finite number in range; a boolean, a string, NaN or anything else raises ValueError."""
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    # NaN fails both comparisons; an integer too large for a float compares exactly.
    if not number or not MIN_SHARE_WEIGHT <= value <= MAX_SHARE_WEIGHT:  # type: ignore[operator]
        raise ValueError(SHARE_WEIGHT_RULE)
    return float(value)  # type: ignore[arg-type]


def share_weight_in_effect(account: Account, settings: Settings) -> tuple[float, bool]:
    """The weight the account's lanes give it, and whether that is its type's."""
    return weight_in_effect(account.type, account.share_weight, settings)


def weight_in_effect(
    account_type: str, own: float | None, settings: Settings
) -> tuple[float, bool]:
    """An account's own weight held to the allowed range (one written to the column by
    hand skips the API's check: a weight near 0 would make its pass infinite and stop the
    lane's clock), else its type's; and whether it is its type's."""
    if own is None:
        return float(settings.share_weight(account_type)), True
    return min(max(float(own), MIN_SHARE_WEIGHT), MAX_SHARE_WEIGHT), False
