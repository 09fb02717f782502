"""Dynamic batching of single requests: wait-or-full, with a wait that adapts to traffic.

A batch goes when it holds `max_items` items, or when its oldest request has waited
`max_wait` seconds, whichever comes first. Holding a request only pays when others are
about to arrive, so the wait adapts to the arrival rate: an EWMA of the gaps between
arrivals predicts the next one. When that gap is as long as `max_wait` (a quiet system),
a lone request goes at once, and so does a lone request while arrivals are not dense
(under an eighth of `max_wait` apart: a sequential caller's next request only comes after
this answer, so holding it gains nothing); when the burst that filled the batch has
stopped (nothing arrived for twice the expected gap), the batch goes without waiting out
`max_wait`.
While the model runs a batch, new requests queue up, so under load batches fill by
themselves. With several model threads, the items due are shared out among the free
ones, a batch is held to grow only while no other model thread is free, and while other
batches run a batch takes no more than its fair part of the process's items (due and
running) and goes without a hold once it has it: closed-loop callers stay in even cohorts.

`BatchPolicy` and `DynamicBatcher.take` are pure (a clock is passed in), so the rules are
tested with a fake clock; `DynamicBatcher.start` runs them in one or more model threads
(each takes the batch due when it is free). Each request has its own Future: it gets its
own result or its own exception, and a batch that raises fails every request in it, so
none is left waiting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
# A lone request is held only when arrivals are this many times denser than max_wait (at
# least this many more expected within it); two or more waiting requests show concurrency.
LONE_HOLD_FACTOR = 8


@dataclass
class BatchPolicy:
    """When a batch should go, from the items waiting and the recent arrival gaps."""

    max_items: int = 64
    max_wait: float = 0.050
    alpha: float = 0.2  # weight of the newest gap in the EWMA
    gap: float = float("inf")  # expected seconds between two arrivals
    last_arrival: float | None = None

    def arrived(self, now: float) -> None:
        if self.last_arrival is not None:
            seen = min(now - self.last_arrival, 10 * self.max_wait)
            self.gap = (
                seen
                if self.gap == float("inf")
                else (self.alpha * seen + (1 - self.alpha) * self.gap)
            )
        self.last_arrival = now

    def wait(self, now: float, items: int, oldest: float, requests: int = 2) -> float:
        """Seconds to hold the batch before it goes: 0 means now."""
        if items <= 0:
            return float("inf")
        if items >= self.max_items or self.gap >= self.max_wait:
            return 0.0
        if requests < 2 and self.gap * LONE_HOLD_FACTOR >= self.max_wait:
            # One request waiting and arrivals not dense: a sequential caller (whose next
            # request comes only after this answer) would gain nothing from a hold.
            return 0.0
        deadline = oldest + self.max_wait
        assert self.last_arrival is not None
        lull = self.last_arrival + 2 * self.gap  # the burst is over: nothing more is coming
        return max(0.0, min(deadline, lull) - now)


# Batches run side by side while the model stage is at least this share of a batch's time
# on its model thread (an average over recent batches); below it, one at a time.
SIDE_BY_SIDE_SHARE = 0.5


@dataclass
class SideBySide:
    """How many batches may run at once: every model thread while the model stage is at
    least SIDE_BY_SIDE_SHARE of a batch's time (EWMAs of both), one otherwise. Before any
    batch has run, every thread (the count was chosen for a model that is the cost)."""

    threads: int
    alpha: float = 0.2  # weight of the newest batch in the averages
    model: float = 0.0  # seconds of a batch in its model stage (EWMA)
    whole: float = 0.0  # seconds of a batch on its model thread, start to answers out (EWMA)

    def ran(self, model: float, whole: float) -> None:
        if self.whole == 0.0:
            self.model, self.whole = model, whole
        else:
            self.model = self.alpha * model + (1 - self.alpha) * self.model
            self.whole = self.alpha * whole + (1 - self.alpha) * self.whole

    @property
    def allowed(self) -> int:
        if self.whole <= 0.0 or self.model >= SIDE_BY_SIDE_SHARE * self.whole:
            return self.threads
        return 1


@dataclass
class Pending:
    payload: Any
    size: int
    arrived: float
    future: Future = field(default_factory=Future)


class DynamicBatcher:
    """Collects requests and hands them to `run_batch(payloads) -> results` in batches.

    `run_batch` returns one result per payload, in order; a result that is an exception
    fails only its own request.
    """

    def __init__(
        self,
        run_batch: Callable[[Sequence[Any]], Sequence[Any]],
        max_items: int = 64,
        max_wait: float = 0.050,
        clock: Callable[[], float] = time.monotonic,
        after_batch: Callable[[], None] | None = None,
        threads: int = 1,
        thread_start: Callable[[], None] | None = None,
        before_run: Callable[[bool], None] | None = None,
    ) -> None:
        self.run_batch = run_batch
        # Model threads, each running one batch at a time (`thread_start` first runs in
        # each: say, its own torch thread count); with several, a batch is taken while
        # another runs, so the cores never wait on one batch's serial parts.
        self.threads = max(1, threads)
        self.thread_start = thread_start
        # Called on the model thread before each batch, with whether the batch has the
        # process to itself: no other batch running and none due after it (a lone request,
        # say), so it may take every core; then the cores go back to one batch each.
        self.before_run = before_run
        self.running = 0  # batches running now
        self.side_by_side = SideBySide(self.threads)  # how many of them may run at once
        self.running_items = 0  # and the items in them
        # Model threads waiting for a batch, the most recently freed last: it takes what is
        # due (a lone request keeps going to the thread that ran the last one, whose memory
        # and caches are warm; Condition.notify would wake the longest idle).
        self._idle: list[threading.Condition] = []
        # Called once every request of a batch is settled: bookkeeping nobody should wait on.
        self.after_batch = after_batch
        self.policy = BatchPolicy(max_items, max_wait)
        self.clock = clock
        self.pending: list[Pending] = []
        self._lock = threading.RLock()
        self.cond = threading.Condition(self._lock)  # its lock guards everything here
        self.batches = 0
        # Requests submitted and not yet settled, and since when (wall clock) there have
        # been some or none: the worker's heartbeat reports it as busy or idle.
        self.in_flight = 0
        self.since = time.time()
        self._threads: list[threading.Thread] = []
        self._stop = False

    def submit(self, payload: Any, size: int = 1) -> Future:
        with self.cond:
            self._count(1)
            now = self.clock()
            self.policy.arrived(now)
            request = Pending(payload, max(1, size), now)
            self.pending.append(request)
            self._wake_top()
        return request.future

    def take(
        self, now: float, share: int = 1, free: int | None = None
    ) -> tuple[list[Pending], float]:
        """The batch due now (whole requests, up to max_items items; one larger request
        goes alone), or nothing and the seconds to wait. Call with the lock held. With
        `share` model threads free, the due items are shared out among them: each batch
        takes its part, and the batches run side by side. A batch takes no more than its
        fair part of the items in the process (due and running) either: a free thread that
        took all that is due while another runs would make a batch several times the
        other's on one core, a cohort of callers that stays uneven and waits the longest
        (at 8 clients on 2 cores, batches of 6-7 beside batches of 1-2). `free`: the model
        threads free (`share` unless given). A batch is held to grow only while no other
        thread is free to take what comes meanwhile, or while others are free but may not
        run a batch beside this one (`share` below `free`: batches one at a time) and two
        or more requests are due: concurrent callers, whose batch grows; a lone request
        then goes at once, since a sequential caller's next one only comes after it."""
        items = sum(p.size for p in self.pending)
        oldest = self.pending[0].arrived if self.pending else now
        wait = self.policy.wait(now, items, oldest, len(self.pending))
        most = min(self.policy.max_items, -(-items // max(1, share)))
        if self.running_items:  # another batch runs: this one's fair part of the process
            fair = -(-(items + self.running_items) // self.threads)
            most = min(most, fair)
            if items >= fair:
                wait = 0.0  # as large as its part already: a hold would only delay it
        free = share if free is None else free
        may_hold = free < 2 or (share < free and len(self.pending) >= 2)
        if not items or (wait > 0 and may_hold):
            return [], wait
        batch, total = [], 0
        while self.pending and (not batch or total + self.pending[0].size <= most):
            request = self.pending.pop(0)
            batch.append(request)
            total += request.size
        return batch, 0.0

    def next_batch(self, now: float) -> tuple[list[Pending], float]:
        """What the free model thread at the top takes now (`take`, the due items shared
        among the free threads that may run a batch): nothing while as many batches run as
        may run at once (`SideBySide`); the thread whose batch ends takes the next one.
        Call with the lock held."""
        room = self.side_by_side.allowed - self.running
        if room <= 0:
            return [], float("inf")
        return self.take(now, min(self.free, room), self.free)

    def run(self, batch: Sequence[Pending]) -> None:
        """Run one batch; every request's future is settled, whatever happens."""
        self.batches += 1
        try:
            results = list(self.run_batch([p.payload for p in batch]))
            if len(results) != len(batch):
                raise RuntimeError(f"the batch gave {len(results)} results for {len(batch)}")
        except BaseException as exc:  # noqa: BLE001 - no request may be left waiting
            log.warning("a batch of %s requests failed: %s", len(batch), exc)
            results = [exc] * len(batch)
        for request, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                request.future.set_exception(result)
            else:
                request.future.set_result(result)
        with self.cond:
            self._count(-len(batch))
        if self.after_batch is not None:
            try:
                self.after_batch()
            except Exception as exc:  # noqa: BLE001 - the answers are out; only bookkeeping lost
                log.warning("after a batch: %s", exc)

    def ran(self, model: float, whole: float) -> None:
        """A batch's seconds in its model stage and in all (`run_batch` reports them): they
        decide whether batches run side by side (`SideBySide`)."""
        with self.cond:
            before = self.side_by_side.allowed
            self.side_by_side.ran(model, whole)
            now = self.side_by_side.allowed
            if now != before:
                log.debug("interactive batches: %s at a time (model %.0f %% of a batch)",
                          now, 100 * self.side_by_side.model / self.side_by_side.whole)  # fmt: skip
            if now > before and self.pending:
                self._wake_top()  # room for another batch beside this one

    def _count(self, change: int) -> None:
        """Requests in flight go up or down; a start or end of a busy spell is dated."""
        if (self.in_flight == 0) != (self.in_flight + change == 0):
            self.since = time.time()
        self.in_flight += change

    def activity(self) -> tuple[int, float]:
        """Requests in flight now, and since when (time.time()) there have been some or none."""
        with self.cond:
            return self.in_flight, self.since

    @property
    def free(self) -> int:
        """Model threads waiting for a batch."""
        return len(self._idle)

    def _wake_top(self) -> None:
        """Call with the lock held: the most recently freed model thread looks at what is due,
        if another batch may start now; else the thread whose batch ends takes it (a wake-up
        per request, to find no room, would cost the process a thread switch each)."""
        if self._idle and self.side_by_side.allowed > self.running:
            self._idle[-1].notify()

    def _loop(self) -> None:
        if self.thread_start is not None:
            self.thread_start()
        mine = threading.Condition(self._lock)  # this thread's own wake-up
        while True:
            with self.cond:
                self._idle.append(mine)
                while True:
                    if self._stop:
                        self._idle.remove(mine)
                        return
                    wait = float("inf")
                    if self._idle[-1] is mine:  # the others wait their turn at the top
                        batch, wait = self.next_batch(self.clock())
                        if batch:
                            break
                    mine.wait(None if wait == float("inf") else wait)
                self._idle.remove(mine)
                alone = self.running == 0 and not self.pending
                self.running += 1
                size = sum(p.size for p in batch)
                self.running_items += size
                if self.pending:
                    self._wake_top()  # the rest is the next free thread's part
            try:
                if self.before_run is not None:
                    try:
                        self.before_run(alone)
                    except Exception as exc:  # noqa: BLE001 - the batch runs regardless
                        log.warning("before a batch: %s", exc)
                self.run(batch)
            finally:
                with self.cond:
                    self.running -= 1
                    self.running_items -= size

    def start(self) -> DynamicBatcher:
        for n in range(self.threads):
            thread = threading.Thread(target=self._loop, name=f"laneway-batcher-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def drain(self) -> list[Pending]:
        """Take every request not yet in a batch, unsettled, for the caller to settle (put
        back where it came from, say); a batch already running finishes."""
        with self.cond:
            left, self.pending = self.pending, []
            self._count(-len(left))
        return left

    def stop(self) -> None:
        with self.cond:
            self._stop = True
            for waiting in self._idle:
                waiting.notify()
            left, self.pending = self.pending, []
            self._count(-len(left))
        for request in left:
            request.future.set_exception(RuntimeError("the batcher stopped"))
        for thread in self._threads:
            thread.join(5)
