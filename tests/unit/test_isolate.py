import pytest

from core.util.isolate import isolate


class Poison(Exception):
    pass


def model(items):
    """Doubles numbers; any negative number in the batch makes the whole batch fail."""
    if any(x < 0 for x in items):
        raise Poison(f"negative in batch of {len(items)}")
    return [2 * x for x in items]


def test_only_the_poison_items_fail():
    items = [1, 2, -3, 4, 5, 6, -7, 8]
    found = isolate(items, model)
    assert found.failed == [2, 6]
    assert found.outputs == [2, 4, None, 8, 10, 12, None, 16]
    assert all("Poison" in found.failures[i].error for i in (2, 6))
    assert "Traceback" in found.failures[2].traceback


def test_a_clean_batch_runs_once_and_a_known_failure_is_not_run_again():
    assert isolate([1, 2, 3], model).runs == 1
    found = isolate([1, -2, 3, 4], model, known_failure=Poison("already failed"))
    # Halves then quarters of the failing half: 2 + 2 runs, never the whole batch.
    assert found.failed == [1] and found.runs == 4


def test_one_poison_item_costs_about_two_runs_per_halving():
    items = list(range(1, 257))
    items[100] = -1
    found = isolate(items, model, known_failure=Poison("x"))
    assert found.failed == [100]
    assert found.runs == 2 * 8  # log2(256) levels, two halves each


def test_every_item_failing_fails_each_of_them():
    found = isolate([-1, -2, -3], model)
    assert found.failed == [0, 1, 2] and found.outputs == [None, None, None]


class Cancelled(Exception):
    pass


def test_fatal_errors_are_nobodys_item_and_propagate():
    def cancelled(_items):
        raise Cancelled()

    with pytest.raises(Cancelled):
        isolate([1, 2], cancelled, known_failure=Poison("x"), fatal=(Cancelled,))


def test_a_run_returning_the_wrong_number_of_outputs_is_an_error():
    with pytest.raises(RuntimeError, match="2 outputs for 3 items"):
        isolate([1, 2, 3], lambda items: [0, 0])


def test_nothing_to_isolate():
    found = isolate([], model)
    assert (found.outputs, found.failures, found.runs) == ([], [], 0)
