"""A stand-in for a thread pool's submit: it keeps the work for the test to run when it
chooses, so that what runs out of a request's way is tested without a thread."""

from __future__ import annotations

from collections.abc import Callable


class Later:
    def __init__(self) -> None:
        self.jobs: list[Callable[[], None]] = []

    def __call__(self, job: Callable[[], None]) -> None:
        self.jobs.append(job)

    def run(self) -> None:
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            job()
