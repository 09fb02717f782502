"""The one name tests/conftest.py imports from here while that file is reworked elsewhere.
Everything else imports from the subject modules (db/accounts.py, db/intake.py,
db/results.py, db/common.py); this module goes once tests/conftest.py does too."""

from db.accounts import create_account

__all__ = ["create_account"]
