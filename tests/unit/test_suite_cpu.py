"""tools/suite_cpu.py: the CPU lines tests/cpumeter.py writes, summed by test file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_tool():
    spec = importlib.util.spec_from_file_location("suite_cpu", ROOT / "tools" / "suite_cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lines_are_summed_by_file_with_each_file_s_costliest_test():
    lines = [
        "2.50\ttests/e2e/test_a.py::test_one",
        "7.25\ttests/e2e/test_a.py::test_two[redis]",
        "1.00\ttests/unit/test_b.py::test_three",
        "0.75\ttests/e2e/test_a.py::test_four",
        "",  # a blank line, and a line without a test id, count for nothing
        "3.00",
    ]
    files = load_tool().by_file(lines)
    assert files == {
        "tests/e2e/test_a.py": (10.5, 7.25, "tests/e2e/test_a.py::test_two[redis]"),
        "tests/unit/test_b.py": (1.0, 1.0, "tests/unit/test_b.py::test_three"),
    }
