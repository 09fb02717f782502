"""Find the items that make a batch fail, by splitting it in halves until they stand alone.

Pure logic, no Celery or database: the chunk tasks use it once a chunk has failed through
its retries, so one poison text costs its own result, not its chunk's.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Failure:
    """Why one item failed: the exception's one-line summary and its traceback."""

    error: str
    traceback: str

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        return cls(
            f"{type(exc).__name__}: {exc}",
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )


@dataclass
class Isolated(Generic[T]):
    """Per item, an output or a Failure (exactly one of the two); `runs` counts the calls."""

    outputs: list[Any | None]
    failures: list[Failure | None]
    runs: int

    @property
    def failed(self) -> list[int]:
        return [i for i, f in enumerate(self.failures) if f is not None]


def isolate(
    items: Sequence[T],
    run: Callable[[Sequence[T]], Sequence[Any]],
    known_failure: BaseException | None = None,
    fatal: tuple[type[BaseException], ...] = (),
) -> Isolated[T]:
    """Run `run` on `items`, splitting whatever fails in halves down to single items.

    `known_failure` says the whole batch already failed with it (it is not run again).
    Exceptions in `fatal` are not the items' fault (a cancellation, a lost database): they
    propagate at once instead of being pinned on an item.
    """
    n = len(items)
    outputs: list[Any | None] = [None] * n
    failures: list[Failure | None] = [None] * n
    runs = 0

    def attempt(lo: int, hi: int, failure: BaseException | None) -> None:
        nonlocal runs
        if failure is None:
            runs += 1
            try:
                out = list(run(items[lo:hi]))
            except fatal:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure is the items' until split
                failure = exc
            else:
                if len(out) != hi - lo:
                    raise RuntimeError(f"run returned {len(out)} outputs for {hi - lo} items")
                outputs[lo:hi] = out
                return
        if hi - lo == 1:
            failures[lo] = Failure.of(failure)
            return
        mid = (lo + hi) // 2
        attempt(lo, mid, None)
        attempt(mid, hi, None)

    if n:
        attempt(0, n, known_failure)
    return Isolated(outputs, failures, runs)
