"""Zero-shot accuracy through the fleet: the labelled set as a classify job, as shipped and at fp32.

Runs examples/labelled.jsonl (630 customer messages with their true category) through a
real `laneway worker cpu` twice, once with default settings (LANEWAY_PRECISION=auto: bf16
on a CPU with native bf16) and once with LANEWAY_PRECISION=fp32, and prints each run's
accuracy against the true labels, the share of labels the two runs agree on, and the
difference in points (a release keeps the shipped precision within 0.5 points of fp32).
Same database and broker rules as bench/throughput.py.

  HF_HUB_OFFLINE=1 .venv/bin/python bench/fleet_accuracy.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput  # noqa: E402 - sets up the environment the fleet runs in

LABELLED = throughput.ROOT / "examples" / "labelled.jsonl"


def main() -> None:
    from core.config.settings import get_settings
    from core.store.redis_conn import embedded_redis
    from db.migrate import upgrade

    rows = [json.loads(line) for line in LABELLED.read_text().splitlines() if line.strip()]
    texts, truth = [r["text"] for r in rows], [r["label"] for r in rows]
    labels = list(dict.fromkeys(truth))
    settings = get_settings()
    upgrade(settings)
    runs = {"as shipped": {}, "fp32": {"LANEWAY_PRECISION": "fp32", "LANEWAY_CACHE_TTL": "0"}}
    runs["as shipped"]["LANEWAY_CACHE_TTL"] = "0"  # each run computes every item
    predicted: dict[str, list[str]] = {}
    report: dict[str, dict] = {}
    with embedded_redis(settings):
        for name, env in runs.items():
            outputs: list = []
            info = throughput.run_fleet(texts, "classify", "trial", 0, env, name, labels, outputs)
            predicted[name] = [o["label"] for o in outputs]
            accuracy = sum(p == t for p, t in zip(predicted[name], truth, strict=True)) / len(truth)
            report[name] = {
                "accuracy": round(accuracy, 4),
                "status": info["status"],
                "worker": info["worker_log_lines"],
            }
    agree = sum(a == b for a, b in zip(*predicted.values(), strict=True)) / len(truth)
    report["labels_unchanged"] = round(agree, 4)
    report["points_from_fp32"] = round(
        100 * (report["as shipped"]["accuracy"] - report["fp32"]["accuracy"]), 2
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
