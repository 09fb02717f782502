"""The names fleet/cli.py and tests/conftest.py import from here, while those two files
are being reworked elsewhere. New code imports from the subject modules (db/accounts.py,
db/intake.py, db/results.py, db/common.py); this module goes once they do too."""

from db.accounts import (
    add_api_key,
    create_account,
    find_account,
    find_key,
    is_live,
    list_accounts,
    list_keys,
    revoke_key,
    rotate_key,
)
from db.common import aware

__all__ = [
    "add_api_key",
    "aware",
    "create_account",
    "find_account",
    "find_key",
    "is_live",
    "list_accounts",
    "list_keys",
    "revoke_key",
    "rotate_key",
]
