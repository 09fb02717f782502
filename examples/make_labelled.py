#!/usr/bin/env python3
"""Labelled customer messages: make_sample.py's generator, with each message's category kept.

Writes examples/labelled.jsonl (the accuracy set of bench/fleet_accuracy.py)
and inference/data/precision_sample.jsonl (the sample a worker checks a reduced precision
on at start-up), one {"id", "text", "label"} per line; the label is one of Laneway's
default labels. Other seeds than the demo sample's, so neither set repeats it.

Usage:  python3 examples/make_labelled.py
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_sample  # noqa: E402

# make_sample's categories, named as Laneway's default labels (core/config/settings.py).
LABELS = {
    "billing": "billing",
    "shipping": "shipping and delivery",
    "quality": "product quality",
    "account": "account and login",
    "technical": "technical problem",
    "praise": "praise",
    "cancellation": "cancellation and refund",
}
OUTPUTS = (
    (HERE / "labelled.jsonl", 630, 20261124),
    (HERE.parent / "inference" / "data" / "precision_sample.jsonl", 140, 20261125),
)


def generate(n_rows: int, seed: int) -> list[dict[str, str]]:
    """`n_rows` distinct messages, an even spread over the categories, with their labels."""
    rng = random.Random(seed)
    plan = [list(LABELS)[i % len(LABELS)] for i in range(n_rows)]
    rng.shuffle(plan)
    seen: set[str] = set()
    rows = []
    for i, category in enumerate(plan, start=1):
        for _ in range(100):
            text = make_sample.compose(rng, category)
            if make_sample.MIN_WORDS <= len(text.split()) <= make_sample.MAX_WORDS:
                if text not in seen:
                    break
        else:  # pragma: no cover - never hit with the shipped templates
            raise RuntimeError(f"could not make a fresh {category} message")
        seen.add(text)
        rows.append({"id": f"lab-{i:04d}", "text": text, "label": LABELS[category]})
    return rows


def main() -> None:
    for path, rows, seed in OUTPUTS:
        with path.open("w", encoding="utf-8") as fh:
            for row in generate(rows, seed):
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"wrote {rows} rows to {path}")


if __name__ == "__main__":
    main()
