"""Fair share between accounts on one lane: a small job's wait behind a huge one, the split
of a lane between two accounts, what the mechanism costs an account alone, and how fast a
huge job starts.

The fleet: real processes at default settings (bench/controlplane.py's `Fleet`: the web
app, one `laneway worker cpu`, one interactive worker) with the packaged MiniLM, on a
database this run creates and a Redis db index it claims, every job on the cpu lane
(LANEWAY_GPU_THRESHOLD above any job). Accounts are made by `laneway accounts create`;
jobs go through `POST /v1/jobs` as a user sends them.

1. small_wait: account A (enterprise) submits --big items; once its first chunk runs,
   account B (trial) submits --small items; B's seconds from its POST to its final status.
   A is then cancelled.
2. shares: two standard accounts submit --share-items each at once; every second the
   results each has is read, and each whole window of --window-seconds (30) while both
   have work gives each account's part of the items finished in it. Run for
   --share-seconds, then cancelled. Then the same with the first account's weight set to
   3 and the second's to 1.
3. alone: one account's --alone-items job, alone on the lane: items/s from the POST to
   the final status. With --baseline DIR (a checkout of the commit before fair share, its
   own database), the same job on that fleet, run before and after this one's, so a drift
   of the machine shows.
4. first_chunk: a --huge-line CSV upload; seconds from the response (its commit) to its
   first chunk's start, then cancelled. (The dispatch's memory is bench/ingest.py's
   --dispatch figure.)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.controlplane import (  # noqa: E402
    ADMIN_PG,
    BIN,
    FINAL,
    REDIS_HOST,
    Fleet,
    call,
    claim_redis_index,
    create_database,
    drop_database,
    release_redis_index,
)

TYPES = ("TRIAL", "STANDARD", "ENTERPRISE")


def session():  # noqa: ANN201
    """A session on the running fleet's database (read from the environment each time:
    each fleet of the run has its own; get_settings() would keep the first)."""
    from core.config.settings import Settings
    from db.session import session_scope

    return session_scope(Settings.from_env())


def new_account(kind: str, weight: float | None = None) -> tuple[str, str]:
    """(name, API key) of a new account, made by the fleet's own `laneway accounts create`
    (the baseline's code writes the baseline's schema); `weight` its own share weight."""
    import subprocess

    from sqlalchemy import text

    name = f"fs-{kind}-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(
        [str(BIN / "laneway"), "accounts", "create", name, "--type", kind],
        capture_output=True, text=True, check=True, env={**os.environ},
    )  # fmt: skip
    if weight is not None:
        with session() as s:
            s.execute(
                text("UPDATE accounts SET share_weight = :w WHERE name = :n"),
                {"w": weight, "n": name},
            )
    return name, made.stdout.strip().splitlines()[-1]


def items(n: int, tag: str) -> list[dict]:
    from bench.throughput import load_texts

    return [{"id": f"{tag}{i}", "text": t} for i, t in enumerate(load_texts(n))]


def submit(port: int, key: str, body_items: list[dict], task: str) -> str:
    body = json.dumps({"task": task, "items": body_items}).encode()
    return call(port, "POST", "/v1/jobs", key, body)["id"]


def status(job_id: str) -> str:
    from db.models import Job

    with session() as s:
        return s.get(Job, uuid.UUID(job_id)).status


def done_items(job_ids: list[str]) -> dict[str, int]:
    from sqlalchemy import func, select

    from db.models import Result

    with session() as s:
        rows = s.execute(
            select(Result.job_id, func.count())
            .where(Result.job_id.in_([uuid.UUID(j) for j in job_ids]))
            .group_by(Result.job_id)
        ).all()
    found = {str(j): n for j, n in rows}
    return {j: found.get(j, 0) for j in job_ids}


def first_start(job_id: str) -> float | None:
    from sqlalchemy import func, select

    from db.models import Chunk

    with session() as s:
        moment = s.scalar(
            select(func.min(Chunk.started_at)).where(Chunk.job_id == uuid.UUID(job_id))
        )
    return moment.timestamp() if moment else None


def wait_final(job_id: str, timeout: float) -> float:
    started = time.monotonic()
    while status(job_id) not in FINAL:
        if time.monotonic() - started > timeout:
            raise SystemExit(f"job {job_id} did not end within {timeout} s")
        time.sleep(0.1)
    return time.monotonic() - started


def cancel(port: int, key: str, job_id: str) -> None:
    if status(job_id) not in FINAL:
        call(port, "DELETE", f"/v1/jobs/{job_id}", key)


def small_wait(port: int, big: int, small: int, task: str) -> dict:
    _, key_a = new_account("enterprise")
    _, key_b = new_account("trial")
    a = submit(port, key_a, items(big, "a"), task)
    while first_start(a) is None:
        time.sleep(0.1)
    time.sleep(5.0)  # A's job well under way: its chunks hold the lane
    started = time.monotonic()
    b = submit(port, key_b, items(small, "b"), task)
    wait_final(b, 3600)
    seconds = time.monotonic() - started
    a_done = done_items([a])[a]
    cancel(port, key_a, a)
    return {
        "big_items": big,
        "small_items": small,
        "small_job_seconds": round(seconds, 2),
        "big_items_done_meanwhile": a_done,
        "small_status": status(b),
    }


def shares(
    port: int, n: int, seconds: float, task: str, weights: tuple[float, float], window: float
) -> dict:
    ids_keys = [new_account("standard", w) for w in weights]
    bodies = [items(n, f"s{i}-") for i in range(2)]
    jobs: list[str] = [""] * 2

    def send(i: int) -> None:
        jobs[i] = submit(port, ids_keys[i][1], bodies[i], task)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    samples: list[tuple[float, dict[str, int]]] = []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        samples.append((time.monotonic(), done_items(jobs)))
        time.sleep(1.0)
    for (_, key), job in zip(ids_keys, jobs, strict=True):
        cancel(port, key, job)
    windows = []
    begin = next((k for k, (_, d) in enumerate(samples) if sum(d.values())), None)
    k = begin
    while k is not None:
        end = next(
            (j for j in range(k, len(samples)) if samples[j][0] - samples[k][0] >= window),
            None,
        )
        if end is None:
            break
        got = [samples[end][1][j] - samples[k][1][j] for j in jobs]
        if min(samples[end][1][j] for j in jobs) >= n:
            break  # one of them ran out of work
        windows.append({"items": got, "first_share": round(got[0] / max(1, sum(got)), 3)})
        k = end
    return {
        "weights": list(weights),
        "items_each": n,
        "windows": windows,
        "first_share_range": [
            min(w["first_share"] for w in windows),
            max(w["first_share"] for w in windows),
        ]
        if windows
        else None,
    }


def alone(port: int, n: int, task: str) -> dict:
    _, key = new_account("standard")
    started = time.monotonic()
    job = submit(port, key, items(n, "g"), task)
    wait_final(job, 3600)
    seconds = time.monotonic() - started
    return {
        "items": n,
        "seconds": round(seconds, 2),
        "items_per_s": round(n / seconds, 1),
        "status": status(job),
        **between_chunks(job),
    }


def between_chunks(job_id: str) -> dict:
    """The worker's time from one chunk's end to the next one's start (its claim), and
    each chunk's own run, in ms: what the lane spends outside the chunks themselves."""
    from sqlalchemy import select

    from db.models import Chunk

    with session() as s:
        rows = s.execute(
            select(Chunk.started_at, Chunk.finished_at)
            .where(Chunk.job_id == uuid.UUID(job_id), Chunk.state == "done")
            .order_by(Chunk.started_at)
        ).all()
    gaps = sorted((b.started_at - a.finished_at).total_seconds() for a, b in pairwise(rows))
    runs = [(r.finished_at - r.started_at).total_seconds() for r in rows]
    if not gaps:
        return {}
    return {
        "gap_ms_median": round(1000 * gaps[len(gaps) // 2], 1),
        "gap_ms_mean": round(1000 * sum(gaps) / len(gaps), 1),
        "run_ms_mean": round(1000 * sum(runs) / len(runs), 1),
    }


def first_chunk(port: int, lines: int, task: str) -> dict:
    _, key = new_account("enterprise")
    rows = "id,text\n" + "".join(
        f"h{i},{t['text'].replace(',', ' ')}\n" for i, t in enumerate(items(lines, "h"))
    )
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    boundary = uuid.uuid4().hex
    body = io.BytesIO()
    head = f"--{boundary}\r\nContent-Disposition: form-data; name="
    body.write(f'{head}"task"\r\n\r\n{task}\r\n'.encode())
    body.write(f'{head}"file"; filename="huge.csv"\r\nContent-Type: text/csv\r\n\r\n'.encode())
    body.write(rows.encode())
    body.write(f"\r\n--{boundary}--\r\n".encode())
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": f"multipart/form-data; boundary={boundary}",
    }
    sent = time.time()
    conn.request("POST", "/v1/jobs", body.getvalue(), headers)
    response = conn.getresponse()
    answer = json.loads(response.read())
    committed = time.time()
    if response.status != 202:
        raise SystemExit(f"upload: {response.status} {answer}")
    job = answer["id"]
    while (start := first_start(job)) is None:
        if time.time() - committed > 300:
            raise SystemExit("the huge job's first chunk did not start within 300 s")
        time.sleep(0.05)
    cancel(port, key, job)
    return {
        "lines": lines,
        "upload_seconds": round(committed - sent, 2),
        "first_chunk_after_commit_seconds": round(start - committed, 2),
    }


def fleet_run(args: argparse.Namespace, checkout: Path, index: int, work) -> dict:  # noqa: ANN001
    """Start a fleet of `checkout`'s code on a database of its own and this run's Redis
    db index (emptied first), and run `work(port)`."""
    import redis

    redis.Redis.from_url(f"{REDIS_HOST}/{index}").flushdb()
    logdir = Path(tempfile.mkdtemp(prefix="laneway-fairshare-"))
    database, database_url = create_database(ADMIN_PG)
    env = {
        "LANEWAY_DATABASE_URL": database_url,
        "LANEWAY_REDIS_URL": f"{REDIS_HOST}/{index}",
        "LANEWAY_HOME": str(logdir / "home"),
        "PYTHONPATH": f"{checkout}:{checkout / 'client'}",
        "LANEWAY_MAX_ITEMS": str(2_000_000),
        "LANEWAY_MAX_UPLOAD_BYTES": str(1 << 30),
        **{f"LANEWAY_MAX_ITEMS_{t}": str(2_000_000) for t in TYPES},
        **{f"LANEWAY_MAX_UPLOAD_BYTES_{t}": str(1 << 30) for t in TYPES},
        "LANEWAY_RATE_LIMIT_TRIAL": "100000/minute",
        # Every job on the cpu lane, whatever its account and size: the one lane measured.
        "LANEWAY_GPU_THRESHOLD": str(10**9),
    }
    saved = dict(os.environ)
    os.environ.update(env)
    fleet = Fleet(logdir, env, args.port, cwd=checkout)  # its code first on every path
    try:
        import subprocess

        # Each checkout migrates its own database with its own code.
        migrate = "from db.migrate import upgrade; upgrade()"
        subprocess.run(
            [sys.executable, "-c", migrate], cwd=checkout, env={**os.environ}, check=True
        )
        fleet.up(1)
        return work(args.port)
    finally:
        fleet.stop()
        drop_database(ADMIN_PG, database)
        os.environ.clear()
        os.environ.update(saved)
        if not args.keep:
            shutil.rmtree(logdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="embed")
    parser.add_argument("--big", type=int, default=200_000)
    parser.add_argument("--small", type=int, default=300)
    parser.add_argument("--share-items", type=int, default=50_000)
    parser.add_argument("--share-seconds", type=float, default=95.0)
    parser.add_argument("--window-seconds", type=float, default=30.0, help="of each share")
    parser.add_argument("--alone-items", type=int, default=10_000)
    parser.add_argument("--huge", type=int, default=1_000_000, help="lines of the upload")
    parser.add_argument("--baseline", type=Path, default=None, help="checkout before fair share")
    parser.add_argument("--only", default="small_wait,shares,alone,first_chunk")
    parser.add_argument("--port", type=int, default=8793)
    parser.add_argument("--json", default=None, metavar="PATH")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    from bench.latency import finish, speed_probe

    report: dict = {
        "format": 1,
        "task": args.task,
        "cpus": os.cpu_count(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "speed_probe_start_s": speed_probe(),
    }

    def ours(port: int) -> dict:
        out: dict = {}
        if "small_wait" in only:
            out["small_wait"] = small_wait(port, args.big, args.small, args.task)
            print(json.dumps(out["small_wait"]), flush=True)
        if "shares" in only:
            for name, weights in (("equal", (None, None)), ("weighted_3_1", (3.0, 1.0))):
                out[f"shares_{name}"] = shares(
                    port, args.share_items, args.share_seconds, args.task, weights,
                    args.window_seconds,
                )  # fmt: skip
                print(json.dumps(out[f"shares_{name}"]), flush=True)
        if "alone" in only:
            out["alone"] = alone(port, args.alone_items, args.task)
            print(json.dumps(out["alone"]), flush=True)
        if "first_chunk" in only:
            out["first_chunk"] = first_chunk(port, args.huge, args.task)
            print(json.dumps(out["first_chunk"]), flush=True)
        return out

    def baseline(port: int) -> dict:
        return alone(port, args.alone_items, args.task)

    index = claim_redis_index()
    try:
        if args.baseline and "alone" in only:
            report["baseline_alone_before"] = fleet_run(args, args.baseline, index, baseline)
            print(json.dumps(report["baseline_alone_before"]), flush=True)
        report.update(fleet_run(args, ROOT, index, ours))
        if args.baseline and "alone" in only:
            report["baseline_alone_after"] = fleet_run(args, args.baseline, index, baseline)
    finally:
        release_redis_index(index)
    if args.baseline and "alone" in only:
        print(json.dumps(report["baseline_alone_after"]), flush=True)
        base = (
            report["baseline_alone_before"]["items_per_s"]
            + report["baseline_alone_after"]["items_per_s"]
        ) / 2
        report["alone_against_baseline"] = round(report["alone"]["items_per_s"] / base, 3)
    finish(report, args.json)
    return report


if __name__ == "__main__":
    main()
