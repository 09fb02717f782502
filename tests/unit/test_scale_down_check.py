"""beat's question before it stops an idle gpu worker (tasks/scaling.py `_holds_nothing`):
a task that the worker's pool process takes while it is being asked is seen."""

from __future__ import annotations

from types import SimpleNamespace

from tasks.scaling import _holds_nothing

NODE = "gpu0@host"
TASK = {"id": "t1", "name": "laneway.model_chunk"}


class Worker:
    """A worker's inspect answers (as Celery's remote control gives them): its one task
    is reserved until the first question has been answered, then active (its pool process
    took it in between)."""

    def __init__(self, task: bool = True) -> None:
        self.state = "reserved" if task else "none"
        self.asked: list[str] = []

    def _answer(self, kind: str) -> dict[str, list]:
        answer = {NODE: [TASK] if self.state == kind else []}
        self.asked.append(kind)
        if self.state == "reserved":
            self.state = "active"
        return answer

    def inspect(self, **_):
        return SimpleNamespace(
            active=lambda: self._answer("active"), reserved=lambda: self._answer("reserved")
        )


def app_of(worker: Worker):
    return SimpleNamespace(control=SimpleNamespace(inspect=worker.inspect))


def test_a_task_taken_between_the_two_questions_is_seen():
    worker = Worker()
    assert not _holds_nothing(app_of(worker), NODE)
    assert worker.asked == ["reserved"]  # seen at once


def test_a_worker_with_nothing_is_asked_both_and_holds_nothing():
    worker = Worker(task=False)
    assert _holds_nothing(app_of(worker), NODE)
    assert worker.asked == ["reserved", "active"]


def test_a_worker_that_does_not_answer_is_left_alone():
    silent = SimpleNamespace(
        control=SimpleNamespace(
            inspect=lambda **_: SimpleNamespace(active=lambda: None, reserved=lambda: None)
        )
    )
    assert not _holds_nothing(silent, NODE)
