"""The fast path (webapp/fastpath.py): it skips the parse-cost check, its bodies being too
small for any shape of them to cost what the check refuses; Redis away as it writes the
rate-limit headers leaves them out rather than failing the answer."""

from webapp import jsonbudget
from webapp.fastpath import MAX_BODY


def test_no_body_the_fast_path_takes_can_cost_what_the_check_refuses():
    per_byte = max(
        jsonbudget.PER_VALUE, jsonbudget.PER_KEY, jsonbudget.PER_DICT, jsonbudget.PER_BYTE_WIDE
    )
    worst = MAX_BODY * (per_byte + jsonbudget.PER_BYTE_WIDE)
    assert worst <= jsonbudget.MEMORY_MULTIPLE * MAX_BODY + jsonbudget.MEMORY_FLOOR
    for shape in (b"[" * MAX_BODY, b"[" + b"{}," * (MAX_BODY // 3 - 1) + b"{}]"):
        assert jsonbudget.too_costly(shape[:MAX_BODY]) is None


def test_the_headers_are_left_out_when_redis_is_away():
    import redis

    from webapp.fastpath import rate_limit_headers

    class Away:
        def window(self):
            raise redis.ConnectionError("gone")

    assert rate_limit_headers(Away()) == []
