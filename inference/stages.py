"""What a chunk task needs of the model code before any model runs, without torch.

The stop check between micro-batches, the stages' seconds and a run that adds them up:
tasks/chunks.py names these at import, and every process that imports the task modules
(celery beat, Flower, a worker of the maintenance queue alone) would otherwise import
torch and transformers with them: seconds of CPU and a few hundred megabytes for processes
that never run a model. The model code itself (inference.batching, inference.pipeline and
the models) is imported where models run: by a batch lane's worker before its pool forks
(workers/signals.py), by the interactive worker as it loads its models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

# Asked before each micro-batch; True stops the model stage (a cancelled job).
stop_check: ContextVar[Callable[[], bool] | None] = ContextVar("stop_check", default=None)


class Interrupted(Exception):
    """The model stage stopped between micro-batches because its stop check said so."""


@contextmanager
def interruptible(stop: Callable[[], bool]) -> Iterator[None]:
    """Inside this block, every model's micro-batch loop asks `stop()` before each batch."""
    token = stop_check.set(stop)
    try:
        yield
    finally:
        stop_check.reset(token)


@dataclass
class StageTimes:
    """Seconds of each stage, and the sizes of the micro-batches the model stage ran."""

    pre: float = 0.0
    model: float = 0.0
    post: float = 0.0
    batches: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, float]:
        return {"pre": self.pre, "model": self.model, "post": self.post}

    def add(self, other: StageTimes) -> None:
        self.pre += other.pre
        self.model += other.model
        self.post += other.post
        self.batches += other.batches


class TimedRun:
    """`Pipeline.run` over texts for fixed tasks and labels, as a function of the texts;
    `spent` adds up every run's stage seconds and model micro-batches. `pipeline` is an
    inference.pipeline.Pipeline, not named here: this module imports none of it."""

    def __init__(
        self,
        pipeline: Any,
        tasks: Sequence[str],
        labels: Sequence[str],
        before_model: Callable[[Sequence[str]], None] | None = None,
        spent: StageTimes | None = None,
    ) -> None:
        self.pipeline, self.tasks, self.labels = pipeline, tasks, labels
        self.before_model = before_model
        self.spent = StageTimes() if spent is None else spent

    def __call__(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        outputs, times = self.pipeline.run(
            texts, self.tasks, self.labels, before_model=self.before_model
        )
        self.spent.add(times)
        return outputs
