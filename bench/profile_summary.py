"""Where a tier's time went, from the raw stacks `bench/controlplane.py --profile` writes.

    .venv/bin/python bench/profile_summary.py prof/interactive64-web-*.txt

Each line of py-spy's raw format is one stack (frames joined by `;`, outermost first) and its
sample count. This prints, over the files given, the share of samples each function was
running itself (`self`) and the share it was anywhere on the stack (`inclusive`: it or what it
called), the costliest first. Frames are named by function and file, without line numbers,
so that a function's lines count together.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterable

LINE_NUMBER = re.compile(r":\d+\)$")


def shares(lines: Iterable[str]) -> tuple[int, Counter[str], Counter[str]]:
    """Total samples, and samples by function: running itself, and anywhere on the stack."""
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [LINE_NUMBER.sub(")", frame) for frame in stack.split(";")]
        total += n
        own[frames[-1]] += n
        for frame in set(frames):  # a recursive function counts once per sample
            anywhere[frame] += n
    return total, own, anywhere


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="raw stack files of one tier")
    parser.add_argument("--top", type=int, default=40, help="functions to print in each list")
    args = parser.parse_args(argv)
    lines: list[str] = []
    for path in args.files:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines.extend(fh)
    total, own, anywhere = shares(lines)
    print(f"{total} samples")
    for title, counts in (("self", own), ("inclusive", anywhere)):
        print(f"--- {title}")
        for frame, n in counts.most_common(args.top):
            print(f"{100 * n / max(1, total):5.1f} %  {frame}")


if __name__ == "__main__":
    main()
