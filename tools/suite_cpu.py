"""The suite's CPU by test file, from the lines `LANEWAY_TEST_CPU=FILE make test` writes.

    .venv/bin/python tools/suite_cpu.py FILE [--top 30]

Prints each file's CPU seconds (its tests' and the processes they started), the costliest
first, with its share of the whole and its costliest test (tests/cpumeter.py says what is
counted).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path


def by_file(lines: list[str]) -> dict[str, tuple[float, float, str]]:
    """Each file's total, its costliest test's CPU and that test's name."""
    files: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for line in lines:
        seconds, _, nodeid = line.rstrip("\n").partition("\t")
        if nodeid:
            files[nodeid.split("::", 1)[0]].append((float(seconds), nodeid))
    return {path: (sum(s for s, _ in tests), *max(tests)) for path, tests in files.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    files = by_file(args.report.read_text().splitlines())
    whole = sum(total for total, _, _ in files.values()) or 1.0
    print(f"{whole:8.1f} s  all {len(files)} files")
    ranked = sorted(files.items(), key=lambda kv: -kv[1][0])
    for path, (total, top, name) in ranked[: args.top]:
        test = name.split("::", 1)[1]
        print(f"{total:8.1f} s {100 * total / whole:5.1f} %  {path}  (top: {top:.1f} s {test})")


if __name__ == "__main__":
    main()
