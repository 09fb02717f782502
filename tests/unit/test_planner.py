import pytest

from laneway.planner import choose_lane, plan_chunks


@pytest.mark.parametrize("account_type", ["demo", "trial"])
@pytest.mark.parametrize("n", [1, 500, 501, 1_000_000])
def test_demo_and_trial_always_cpu(account_type, n):
    assert choose_lane(account_type, n, gpu_threshold=500) == "cpu"


@pytest.mark.parametrize("account_type", ["standard", "enterprise"])
def test_threshold_is_exclusive(account_type):
    assert choose_lane(account_type, 500, gpu_threshold=500) == "cpu"
    assert choose_lane(account_type, 501, gpu_threshold=500) == "gpu"
    assert choose_lane(account_type, 1, gpu_threshold=0) == "gpu"


def test_unknown_account_type_and_negative_counts_are_refused():
    with pytest.raises(ValueError, match="account type"):
        choose_lane("vip", 10, 500)
    with pytest.raises(ValueError):
        choose_lane("standard", -1, 500)


@pytest.mark.parametrize("n,size", [(0, 4), (1, 4), (4, 4), (5, 4), (1000, 256), (257, 256)])
def test_chunks_cover_every_item_once(n, size):
    chunks = plan_chunks(n, size)
    covered = [i for start, stop in chunks for i in range(start, stop)]
    assert covered == list(range(n))
    assert all(0 < stop - start <= size for start, stop in chunks)
    assert len(chunks) == -(-n // size)


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError):
        plan_chunks(10, 0)
