"""The fast path (webapp/fastpath.py) skips the parse-cost check: its bodies are too small
for any shape of them to cost what the check refuses."""

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
