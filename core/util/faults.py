"""Faults that tests inject on purpose (LANEWAY_FAULTS); without the setting, nothing here acts."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from core.config.settings import Settings
from core.vocab import POISON_MARKER, STALL_MARKER

log = logging.getLogger("core.util.faults")


class PoisonError(RuntimeError):
    """The injected model-stage failure for a text carrying the poison marker."""


def stall_file(settings: Settings) -> Path:
    """While this file exists, `stall` holds the model stage of a chunk with a marked text."""
    return settings.home / "fault-stall"


def model_stage_check(settings: Settings) -> Callable[[Sequence[str]], None] | None:
    """The hook run before the model stage, for the faults that are on:
    - `poison`: raises on a text carrying POISON_MARKER;
    - `stall`: waits, while stall_file() exists, on a chunk with a text carrying
      STALL_MARKER (a test holds a chunk mid-run for as long as it needs, then lets go)."""
    checks = []
    if "poison" in settings.faults:
        checks.append(_poison)
    if "stall" in settings.faults:
        checks.append(lambda texts: _stall(texts, stall_file(settings)))
    if not checks:
        return None

    def check(texts: Sequence[str]) -> None:
        for one in checks:
            one(texts)

    return check


def _poison(texts: Sequence[str]) -> None:
    for text in texts:
        if POISON_MARKER in text:
            raise PoisonError(f"poison item ({POISON_MARKER}) in the model stage")


def _stall(texts: Sequence[str], path: Path) -> None:
    if not any(STALL_MARKER in text for text in texts) or not path.exists():
        return
    log.warning("stalling the model stage while %s exists", path)
    while path.exists():
        time.sleep(0.05)
    log.warning("stall over")
