"""Faults that tests inject on purpose (LANEWAY_FAULTS); without the setting, nothing here acts."""

from __future__ import annotations

from collections.abc import Sequence

from laneway.settings import POISON_MARKER, Settings


class PoisonError(RuntimeError):
    """The injected model-stage failure for a text carrying the poison marker."""


def model_stage_check(settings: Settings):  # noqa: ANN201
    """The hook run before the model stage: raises on a poison text when `poison` is on."""
    if "poison" not in settings.faults:
        return None

    def check(texts: Sequence[str]) -> None:
        for text in texts:
            if POISON_MARKER in text:
                raise PoisonError(f"poison item ({POISON_MARKER}) in the model stage")

    return check
