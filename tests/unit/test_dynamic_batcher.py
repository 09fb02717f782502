"""The dynamic batcher's rules, with a fake clock: full, oldest too old, quiet, lull; and
every request settled with its own result or error."""

from __future__ import annotations

import threading

import pytest

from inference.dynamic import BatchPolicy, DynamicBatcher, SideBySide


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def batcher(run=None, max_items=4, max_wait=0.050):
    clock = Clock()
    run = run or (lambda xs: [x * 10 for x in xs])
    return DynamicBatcher(run, max_items, max_wait, clock), clock


def test_a_lone_request_on_a_quiet_system_is_not_held():
    b, clock = batcher()
    b.submit(1)
    batch, wait = b.take(clock())
    assert [p.payload for p in batch] == [1] and wait == 0
    clock.now += 5.0  # quiet for seconds: the next lone request goes at once too
    b.submit(2)
    assert [p.payload for p in b.take(clock())[0]] == [2]


def test_under_load_a_batch_waits_for_more_until_full():
    b, clock = batcher(max_items=4)
    for n in range(3):  # a burst: 2 ms apart
        b.submit(n)
        clock.now += 0.002
    # More are expected within a few ms: the batch waits (a lull of twice the gap).
    assert b.take(clock()) == ([], pytest.approx(0.002, abs=1e-3))
    b.submit(3)
    b.submit(4)
    batch, wait = b.take(clock())
    # Full at four items: the batch goes with whole requests, in arrival order.
    assert [p.payload for p in batch] == [0, 1, 2, 3] and wait == 0
    assert [p.payload for p in b.pending] == [4]


def test_the_oldest_request_never_waits_past_max_wait():
    policy = BatchPolicy(max_items=64, max_wait=0.050)
    t = 0.0
    for _ in range(20):  # steady arrivals 1 ms apart: the EWMA gap is ~1 ms
        policy.arrived(t)
        t += 0.001
    # One arrival just now, the oldest waiting since 49 ms: at most 1 ms more.
    policy.arrived(t)
    assert policy.wait(t, 10, oldest=t - 0.049) == pytest.approx(0.001, abs=1e-9)
    assert policy.wait(t, 10, oldest=t - 0.060) == 0.0


def test_the_wait_adapts_to_the_arrival_rate():
    fast, slow = BatchPolicy(64, 0.050), BatchPolicy(64, 0.050)
    for n in range(30):
        fast.arrived(n * 0.001)
        slow.arrived(n * 0.020)
    # Expected next arrival: ~1 ms and ~20 ms; the batch waits for a lull of twice that.
    assert fast.wait(0.029, 5, oldest=0.020) == pytest.approx(0.002, abs=2e-4)
    assert slow.wait(0.580, 5, oldest=0.575) == pytest.approx(0.040, abs=1e-3)
    # ... but never past the oldest request's max_wait.
    assert slow.wait(0.580, 5, oldest=0.560) == pytest.approx(0.030, abs=1e-3)
    # The arrivals stopped: the lull has come, the batch goes without waiting out T.
    assert fast.wait(0.040, 5, oldest=0.020) == 0.0
    # Arrivals slower than T apart: no point in holding anything.
    quiet = BatchPolicy(64, 0.050)
    for n in range(5):
        quiet.arrived(n * 0.200)
    assert quiet.wait(0.800, 1, oldest=0.800) == 0.0


def test_a_sequential_callers_lone_request_is_not_held():
    # One caller, request after answer, ~20 ms apart: under T, yet holding gains nothing.
    policy = BatchPolicy(64, 0.050)
    for n in range(30):
        policy.arrived(n * 0.020)
    assert policy.wait(0.580, 1, oldest=0.580, requests=1) == 0.0
    # The same gap with two requests waiting: concurrency, so the batch waits for more.
    assert policy.wait(0.580, 2, oldest=0.575, requests=2) > 0
    # Dense arrivals (2 ms apart): even a lone request is held for the next ones.
    dense = BatchPolicy(64, 0.050)
    for n in range(30):
        dense.arrived(n * 0.002)
    assert dense.wait(0.058, 1, oldest=0.058, requests=1) == pytest.approx(0.004, abs=5e-4)


def test_a_request_larger_than_the_batch_goes_alone_and_sizes_count_items():
    b, clock = batcher(max_items=4)
    b.submit("big", size=9)
    b.submit("small", size=1)
    assert [p.payload for p in b.take(clock())[0]] == ["big"]
    b.submit("three", size=3)
    b.submit("two", size=2)
    clock.now += 1.0  # past max_wait
    assert [p.payload for p in b.take(clock())[0]] == ["small", "three"]


def test_each_request_gets_its_own_result_or_its_own_error():
    def run(xs):
        return [ValueError(f"bad {x}") if x < 0 else x + 1 for x in xs]

    b, clock = batcher(run)
    futures = [b.submit(x) for x in (1, -1, 2)]
    b.run([p for p in b.pending])
    assert futures[0].result() == 2 and futures[2].result() == 3
    with pytest.raises(ValueError, match="bad -1"):
        futures[1].result()


@pytest.mark.parametrize("run", [lambda xs: 1 / 0, lambda xs: [1]])
def test_a_failing_batch_fails_every_request_and_hangs_none(run):
    b, _ = batcher(run)
    futures = [b.submit(x) for x in range(3)]
    b.run(list(b.pending))
    for future in futures:
        assert future.exception(timeout=0) is not None


def test_the_thread_answers_concurrent_callers_in_batches():
    b = DynamicBatcher(lambda xs: [x * 2 for x in xs], max_items=8, max_wait=0.02).start()
    try:
        results: dict[int, int] = {}

        def call(n: int) -> None:
            results[n] = b.submit(n).result(timeout=10)

        threads = [threading.Thread(target=call, args=(n,)) for n in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert results == {n: 2 * n for n in range(40)}
        assert b.batches < 40  # some requests shared a batch
    finally:
        b.stop()


def test_requests_in_flight_and_since_when_and_bookkeeping_after_the_answers():
    seen: list[tuple[int, bool]] = []
    b, _ = batcher()
    b.after_batch = lambda: seen.append((b.in_flight, all(p.future.done() for p in batch)))
    idle, since_start = b.activity()
    assert idle == 0
    futures = [b.submit(x) for x in (1, 2, 3)]
    busy, busy_since = b.activity()
    assert busy == 3 and busy_since >= since_start
    batch = b.pending[:2]
    del b.pending[:2]
    b.run(batch)
    # Bookkeeping runs once the batch's requests are answered, not before.
    assert seen == [(1, True)] and b.activity() == (1, busy_since)  # still busy, same spell
    batch = list(b.pending)
    b.pending.clear()
    b.run(batch)
    assert [f.result() for f in futures] == [10, 20, 30]
    idle, idle_since = b.activity()
    assert idle == 0 and idle_since >= busy_since and seen[-1] == (0, True)


def test_a_failing_bookkeeping_step_loses_no_answer():
    b, _ = batcher()
    b.after_batch = lambda: 1 / 0
    future = b.submit(4)
    b.run(list(b.pending))
    assert future.result(timeout=0) == 40 and b.activity()[0] == 0


def test_requests_dropped_at_stop_leave_nothing_in_flight():
    b, _ = batcher()
    b.submit(1)
    b.stop()
    assert b.activity()[0] == 0


def submit_when_both_free(b: DynamicBatcher, count: int) -> list:
    """Once both model threads wait for work, `count` requests submitted under the
    batcher's (reentrant) lock: the threads see them all at once."""
    for _ in range(1000):
        with b.cond:
            if b.free == 2:
                return [b.submit(n) for n in range(count)]
        threading.Event().wait(0.01)
    raise AssertionError("the model threads never both waited for work")


def test_free_model_threads_share_the_due_items_and_run_them_side_by_side():
    """Two model threads free, four requests due: each takes two, and the two batches run
    at the same time (the barrier breaks, failing both, if one waited for the other)."""
    together = threading.Barrier(2, timeout=10)
    batches: list[list[int]] = []
    started: set[int] = set()

    def run(payloads):
        batches.append(list(payloads))
        together.wait()
        return [p * 10 for p in payloads]

    b = DynamicBatcher(
        run, max_items=64, max_wait=0.0, threads=2,
        thread_start=lambda: started.add(threading.get_ident()),
    ).start()  # fmt: skip
    try:
        futures = submit_when_both_free(b, 4)
        assert [f.result(10) for f in futures] == [0, 10, 20, 30]
        assert sorted(map(len, batches)) == [2, 2] and len(started) == 2
    finally:
        b.stop()


def test_one_free_model_thread_takes_what_is_due_as_before():
    b = DynamicBatcher(lambda p: p, max_items=3, max_wait=0.0, threads=2)
    for n in range(5):
        b.submit(n)
    with b.cond:
        batch, wait = b.take(0.0, share=1)
    assert [p.payload for p in batch] == [0, 1, 2] and wait == 0.0
    with b.cond:
        batch, _ = b.take(0.0, share=2)  # two left, two threads: one each
    assert [p.payload for p in batch] == [3]


def test_a_batch_is_held_to_grow_only_while_no_other_model_thread_is_free():
    b, clock = batcher(max_items=64)
    for n in range(3):  # a burst: arrivals dense, so a lone free thread would hold them
        clock.now += 0.001
        b.submit(n)
    assert b.take(clock(), share=1) == ([], pytest.approx(0.002))
    batch, wait = b.take(clock(), share=2)  # another thread is free: no point holding
    assert [p.payload for p in batch] == [0, 1] and wait == 0.0
    # Nothing pending: nothing taken, and no busy loop (an unbounded wait).
    b.pending.clear()
    assert b.take(clock(), share=2) == ([], float("inf"))


def test_a_lone_request_goes_to_the_model_thread_that_ran_the_last_one():
    """Sequential lone requests keep to one model thread (its memory and caches warm: a
    lone request's p99 falls by a third on one thread, docs/journal/);
    the other takes a part only when two or more are due at once."""
    ran_on: list[int] = []
    together = threading.Barrier(2, timeout=10)

    def run(payloads):
        ran_on.append(threading.get_ident())
        if payloads[0] >= 100:  # the pair below: each part waits for the other's
            together.wait()
        return payloads

    b = DynamicBatcher(run, max_items=64, max_wait=0.0, threads=2).start()
    try:
        for _ in range(1000):  # both threads waiting before the first request
            if b.free == 2:
                break
            threading.Event().wait(0.01)
        for n in range(20):
            assert b.submit(n).result(10) == n
            for _ in range(1000):  # the thread is back among the free before the next
                if b.free == 2:
                    break
                threading.Event().wait(0.001)
        assert len(set(ran_on)) == 1, ran_on
        # Two due at once: the other thread takes its part, side by side.
        with b.cond:
            futures = [b.submit(n) for n in (100, 101)]
        assert [f.result(10) for f in futures] == [100, 101]
        assert len(set(ran_on)) == 2
    finally:
        b.stop()


def test_a_batch_alone_in_the_process_is_told_so_before_it_runs():
    """`before_run` hears, on the model thread, whether its batch has the process to
    itself: a lone request does; a batch beside another running one, or with more due
    after it, does not; a hook that raises loses no answer."""
    told: list[tuple[int, bool]] = []
    release = threading.Event()

    def run(payloads):
        if payloads[0] == 100:  # holds its thread until the next batch is under way
            release.wait(10)
        return payloads

    def before_run(alone: bool) -> None:
        told.append((threading.get_ident(), alone))
        if len(told) == 2:
            release.set()

    b = DynamicBatcher(run, max_items=64, max_wait=0.0, threads=2, before_run=before_run)
    b.start()
    try:
        for _ in range(1000):
            if b.free == 2:
                break
            threading.Event().wait(0.01)
        assert b.submit(1).result(10) == 1  # alone: nothing else running or due
        assert told[-1][1] is True
        told.clear()
        first = b.submit(100)  # runs and holds its thread...
        for _ in range(1000):
            with b.cond:
                if b.running == 1:
                    break
            threading.Event().wait(0.01)
        assert b.submit(2).result(10) == 2  # ...so this one runs beside it: not alone
        assert first.result(10) == 100
        assert [alone for _, alone in told] == [True, False]
        assert told[0][0] != told[1][0]
    finally:
        b.stop()
    with b.cond:
        assert b.running == 0


def test_a_failing_before_run_hook_still_runs_the_batch():
    def before_run(alone: bool) -> None:
        raise RuntimeError("no threads for you")

    b = DynamicBatcher(lambda p: p, max_items=8, max_wait=0.0, before_run=before_run).start()
    try:
        assert b.submit(7).result(10) == 7
    finally:
        b.stop()


def test_a_free_thread_takes_no_more_than_its_fair_part_while_another_batch_runs():
    """Two model threads; one runs a batch of 2 while 6 requests are due. The free thread
    takes 4 (half of the 8 in the process), not all 6: taking all would run 6 on one core
    beside 2 on the other, and those two cohorts of callers would stay uneven."""
    b = DynamicBatcher(lambda p: p, max_items=64, max_wait=0.0, threads=2)
    for n in range(6):
        b.submit(n)
    with b.cond:
        b.running_items = 2
        batch, wait = b.take(0.0, share=1)
    assert [p.payload for p in batch] == [0, 1, 2, 3] and wait == 0.0
    assert [p.payload for p in b.pending] == [4, 5]  # the next free thread's part
    with b.cond:
        b.running_items = 0  # nothing else running: the one free thread's fair part is all
        batch, _ = b.take(0.0, share=1)
    assert [p.payload for p in batch] == [4, 5]


def test_a_batch_as_large_as_the_running_ones_goes_without_waiting_to_grow():
    """A free thread holds a batch to let it grow (arrivals are dense) only while it is
    smaller than its fair part: once it holds as many items as the running batch, the
    hold would only delay it."""
    b, clock = batcher(max_items=64)
    b.threads = 2
    for n in range(3):
        clock.now += 0.001
        b.submit(n)
    with b.cond:
        b.running_items = 4
        assert b.take(clock(), share=1) == ([], pytest.approx(0.002))  # 3 of a fair 4
        clock.now += 0.001
        b.submit(3)
        batch, wait = b.take(clock(), share=1)
    assert [p.payload for p in batch] == [0, 1, 2, 3] and wait == 0.0


def test_the_running_items_are_counted_while_a_batch_runs_and_released_after():
    """The count the fair part is computed from follows the batches, failing ones too."""
    inside = threading.Event()
    release = threading.Event()
    seen: list[int] = []

    def run(payloads):
        seen.append(b.running_items)
        inside.set()
        release.wait(10)
        if payloads[0] == "boom":
            raise RuntimeError("boom")
        return payloads

    b = DynamicBatcher(run, max_items=64, max_wait=0.0, threads=1).start()
    try:
        futures = [b.submit("a", size=3)]
        assert inside.wait(10)
        release.set()
        assert futures[0].result(10) == "a"
        inside.clear()
        failing = b.submit("boom", size=2)
        assert inside.wait(10)
        with pytest.raises(RuntimeError):
            failing.result(10)
        for _ in range(1000):
            with b.cond:
                if b.running == 0:
                    break
            threading.Event().wait(0.01)
        assert seen == [3, 2] and b.running_items == 0
    finally:
        b.stop()


def test_batches_run_side_by_side_only_while_the_model_is_most_of_a_batch():
    """The model stage releases the GIL; the Python around it does not. Side by side while
    the model is at least half a batch's time (recent batches averaged), else one at a
    time; every thread before anything has run."""
    side = SideBySide(threads=2)
    assert side.allowed == 2  # nothing measured: the count chosen for a costly model
    side.ran(model=0.008, whole=0.010)  # a real model's forward on these cores
    assert side.allowed == 2
    side.ran(model=0.0005, whole=0.003)  # one batch of a near-free model: the average holds
    assert side.allowed == 2
    for _ in range(20):  # batches stay mostly Python: one at a time
        side.ran(model=0.0005, whole=0.003)
    assert side.allowed == 1
    for _ in range(20):  # the model is the cost again: side by side again
        side.ran(model=0.009, whole=0.010)
    assert side.allowed == 2
    assert SideBySide(threads=1).allowed == 1
    one = SideBySide(threads=2)
    one.ran(model=0.005, whole=0.010)  # exactly half: still side by side
    assert one.allowed == 2


def python_bound(b: DynamicBatcher) -> None:
    for _ in range(20):
        b.ran(model=0.0002, whole=0.002)
    assert b.side_by_side.allowed == 1


def test_no_batch_starts_beside_a_running_one_while_batches_are_python_bound():
    b = DynamicBatcher(lambda p: p, max_items=64, max_wait=0.0, threads=2)
    b._idle = [threading.Condition(b._lock), threading.Condition(b._lock)]  # both free
    for n in range(4):
        b.submit(n)
    with b.cond:
        batch, _ = b.next_batch(0.0)  # model-bound (nothing measured): shared out
        assert [p.payload for p in batch] == [0, 1]
        b.running, b.running_items = 1, 2
        batch, _ = b.next_batch(0.0)  # the other free thread takes its part beside it
        assert [p.payload for p in batch] == [2, 3]
    b.running, b.running_items = 1, 2
    python_bound(b)
    for n in range(4, 8):
        b.submit(n)
    with b.cond:
        assert b.next_batch(0.0) == ([], float("inf"))  # one runs: no other beside it
        b.running = b.running_items = 0
        batch, wait = b.next_batch(0.0)  # it ended: everything due, not shared out
    assert [p.payload for p in batch] == [4, 5, 6, 7] and wait == 0.0


def test_python_bound_batches_take_everything_due_one_at_a_time():
    """Two model threads, batches reported Python-bound, four requests due at once: one
    batch of all four (model-bound, it would be two of two side by side)."""
    batches: list[list[int]] = []

    def run(payloads):
        batches.append(list(payloads))
        return [p * 10 for p in payloads]

    b = DynamicBatcher(run, max_items=64, max_wait=0.0, threads=2)
    python_bound(b)
    b.start()
    try:
        futures = submit_when_both_free(b, 4)
        assert [f.result(10) for f in futures] == [0, 10, 20, 30]
        assert batches == [[0, 1, 2, 3]]
    finally:
        b.stop()


def test_room_for_a_second_batch_wakes_a_free_thread():
    """A batch reported model-bound again, with requests due while one runs: a free model
    thread is woken to take them beside it (not left until the running batch ends)."""
    b = DynamicBatcher(lambda p: p, max_items=64, max_wait=0.0, threads=2)
    woken: list[str] = []

    class Waiter:
        def notify(self) -> None:
            woken.append("top")

    python_bound(b)
    b._idle = [Waiter()]
    b.submit(1)
    woken.clear()
    b.ran(model=0.5, whole=0.5)  # one batch: the average is now mostly model
    assert b.side_by_side.allowed == 2 and woken == ["top"]


def test_one_batch_at_a_time_holds_no_lone_request_while_another_thread_is_free():
    """A sequential caller's requests arrive densely (each right after its answer), so a
    batcher whose only model thread is free would hold them to grow; with two threads
    running batches one at a time, none is held: nothing else will come meanwhile."""
    b, clock = batcher(max_items=64)
    b.threads = 2
    b.side_by_side = SideBySide(threads=2)
    b._idle = [threading.Condition(b._lock), threading.Condition(b._lock)]
    python_bound(b)
    for n in range(5):  # a sequential caller: one request every 2 ms
        b.submit(n)
        with b.cond:
            batch, wait = b.next_batch(clock())
        assert [p.payload for p in batch] == [n] and wait == 0.0
        clock.now += 0.002
    single, clock = batcher(max_items=64)  # one model thread: it holds them, as before
    for n in range(5):
        single.submit(n)
        clock.now += 0.002
    assert single.take(clock())[0] == []


def test_no_thread_is_woken_for_a_request_no_batch_may_start_on():
    """Batches one at a time and one running: a request that arrives wakes no free thread
    (it could only find no room); the thread whose batch ends takes it."""
    b = DynamicBatcher(lambda p: p, max_items=64, max_wait=0.0, threads=2)
    woken: list[str] = []

    class Waiter:
        def notify(self) -> None:
            woken.append("top")

    b._idle = [Waiter()]
    b.submit(1)  # model-bound (nothing measured), nothing running: woken
    assert woken == ["top"]
    python_bound(b)
    b.running = 1
    woken.clear()
    b.submit(2)
    assert woken == []
    b.running = 0
    b.submit(3)  # nothing running: room again
    assert woken == ["top"]
