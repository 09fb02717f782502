"""Ingest rate and peak memory of a large file through the inbox's path, at two sizes.

Generates (streaming, never in memory) a CSV or JSONL file of N lines and of N/10 lines in
a temporary folder, then ingests each in a fresh child process the way an inbox scan does
(`jobs.inbox.store_file`: read, gunzip, hash, check each line, COPY into the database,
length order and duplicate check in SQL, chunks, one commit). Reports items/s and the
child's peak resident memory (VmHWM) above its baseline after imports, for both sizes: the
peak must not grow with the file. `--dispatch` also times the job's dispatch (its lane's
first refill, jobs/fairshare.py: only the lane's window of chunks is sent, whatever the
job's size) and its peak memory above the resident size just before it.

Runs on whatever LANEWAY_DATABASE_URL names (Postgres for the COPY path); with none set,
on SQLite in a temporary LANEWAY_HOME.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The benchmarks' common start: the repository on the path, a temporary LANEWAY_HOME when
# no database is named.
from throughput import ROOT  # noqa: E402


def vm_kib(field: str) -> int:
    """A memory figure of this process from /proc (VmHWM: peak resident, VmRSS: now)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def generate(path: Path, lines: int, fmt: str) -> None:
    """Distinct texts of 8-60 words from the sample messages, written line by line."""
    with open(ROOT / "examples" / "customer_messages.csv", newline="") as fh:
        base = [row["text"] for row in csv.DictReader(fh)]
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", newline="", encoding="utf-8") as out:
        if fmt == "csv":
            writer = csv.writer(out)
            writer.writerow(["id", "text"])
            for i in range(lines):
                writer.writerow([f"row-{i}", f"{base[i % len(base)]} (ref {i})"])
        else:
            for i in range(lines):
                record = {"id": f"row-{i}", "text": f"{base[i % len(base)]} (ref {i})"}
                out.write(json.dumps(record) + "\n")


def ingest_one(path: Path, dispatch: bool) -> dict:
    """In a fresh process: ingest the file as an inbox scan does; time it, watch memory."""
    import uuid

    from sqlalchemy import delete

    from core.config.settings import get_settings
    from db.accounts import create_account
    from db.migrate import upgrade
    from db.models import Job
    from db.session import session_scope
    from jobs.inbox import store_file

    settings = get_settings()
    upgrade(settings)
    with session_scope(settings) as session:
        account, _ = create_account(session, f"bench-{uuid.uuid4().hex[:8]}", "enterprise")
        session.expunge(account)
    if dispatch:
        from jobs.fairshare import refill  # imports the Celery app: before the baseline

    baseline = vm_kib("VmRSS")
    started = time.perf_counter()
    with path.open("rb") as fh:
        stored = store_file(settings, account, path.name, fh, path.stat().st_size)
    seconds = time.perf_counter() - started
    peak = vm_kib("VmHWM")
    assert isinstance(stored, Job), stored
    job = stored
    out = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "items": job.total_items,
        "lane": job.lane,
        "seconds": round(seconds, 2),
        "items_per_s": round(job.total_items / seconds),
        "baseline_rss_mib": round(baseline / 1024, 1),
        "peak_rss_mib": round(peak / 1024, 1),
        "peak_above_baseline_mib": round((peak - baseline) / 1024, 1),
    }
    if dispatch:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here on
        before = vm_kib("VmRSS")
        started = time.perf_counter()
        out["chunks_sent"] = refill(settings, job.lane)
        out["dispatch_seconds"] = round(time.perf_counter() - started, 3)
        out["dispatch_peak_mib"] = round((vm_kib("VmHWM") - before) / 1024, 1)
    with session_scope(settings) as session:  # keep the benchmark's database small
        session.execute(delete(Job).where(Job.id == job.id))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    parser.add_argument("--gzip", action="store_true", help="gzip the generated files")
    parser.add_argument("--dispatch", action="store_true", help="also dispatch the jobs")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # the child's work
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(ingest_one(args.one, args.dispatch)))
        return
    figures = []
    with tempfile.TemporaryDirectory(prefix="laneway-ingest-") as tmp:
        for lines in (args.lines // 10, args.lines):
            name = f"bench-{lines}.{args.format}" + (".gz" if args.gzip else "")
            path = Path(tmp) / name
            started = time.perf_counter()
            generate(path, lines, args.format)
            print(
                f"generated {name}: {path.stat().st_size / 2**20:.1f} MiB in "
                f"{time.perf_counter() - started:.1f} s",
                file=sys.stderr,
            )
            argv = [sys.executable, __file__, "--one", str(path)]
            child = subprocess.run(
                argv + (["--dispatch"] if args.dispatch else []),
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if child.returncode != 0:
                sys.exit(f"ingest of {name} failed:\n{child.stderr}")
            figures.append(json.loads(child.stdout.strip().splitlines()[-1]))
            print(json.dumps(figures[-1]))
    small, large = figures
    print(
        f"\n{large['items']:,} lines: {large['items_per_s']:,} items/s, peak "
        f"{large['peak_above_baseline_mib']} MiB above baseline; {small['items']:,} lines: "
        f"{small['items_per_s']:,} items/s, peak {small['peak_above_baseline_mib']} MiB",
        file=sys.stderr,
    )
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
