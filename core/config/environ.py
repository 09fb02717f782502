"""Where Settings read their variables from: the LANEWAY_* variables of os.environ, or of
the mapping `Settings.from_env` was given (set in ENVIRON for the one read)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar

from pydantic_settings import EnvSettingsSource
from pydantic_settings.sources.utils import parse_env_vars


class Environment(EnvSettingsSource):
    """The LANEWAY_* variables of os.environ, or of the mapping from_env was given."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        given = ENVIRON.get()
        environ = os.environ if given is None else given
        # Names match as the shell spells them: laneway_chunk_size is not LANEWAY_CHUNK_SIZE
        # (pydantic-settings, case-insensitive, would read either). Blank values are kept
        # here; Settings._blank_is_unset decides which of them mean the default.
        named = {k: v for k, v in environ.items() if k.startswith("LANEWAY_") and k.isupper()}
        return parse_env_vars(named, self.case_sensitive, False, None)


ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("laneway_environ", default=None)
