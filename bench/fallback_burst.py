"""A burst of interactive requests that all become jobs (`Prefer: wait=0`, the 202
fallback), against the real web app (gunicorn, `laneway web`), Postgres and Redis.

Each request stores a one-item job. `--clients` closed-loop clients for `--seconds`:
prints the status codes, p50, p99 and the slowest request. Before 2026-11-27 a job took
a second pooled connection while holding its first, and 64 clients deadlocked the web
processes' pools (5 + 5 connections each) into 30 s waits and 503s (docs/benchmarks.md).

    LANEWAY_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/laneway_latbench \\
    LANEWAY_REDIS_URL=redis://127.0.0.1:6379/11 .venv/bin/python bench/fallback_burst.py
"""

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=8799)
    args = parser.parse_args()

    from core.config.settings import get_settings
    from db.migrate import upgrade
    from db.queries import create_account
    from db.session import session_scope

    settings = get_settings()
    upgrade(settings)
    with session_scope(settings) as session:
        _, key = create_account(session, f"burst-{uuid.uuid4().hex[:6]}", "enterprise")
    log = open(os.devnull, "w")  # noqa: SIM115 - the web app's whole life
    argv = [str(ROOT / ".venv" / "bin" / "laneway"), "web", "--port", str(args.port)]
    web = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(240):
            try:
                probe = http.client.HTTPConnection("127.0.0.1", args.port, timeout=2)
                probe.request("GET", "/healthz")
                if probe.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        codes: Counter[int] = Counter()
        seconds: list[float] = []
        stop = time.time() + args.seconds
        headers = {
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Prefer": "wait=0",
        }

        def client(n: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=120)
            i = 0
            while time.time() < stop:
                body = json.dumps({"items": [{"id": "1", "text": f"burst {n} {i}"}]})
                began = time.perf_counter()
                conn.request("POST", "/v1/embed", body=body, headers=headers)
                answer = conn.getresponse()
                answer.read()
                seconds.append(time.perf_counter() - began)
                codes[answer.status] += 1
                i += 1

        threads = [threading.Thread(target=client, args=(n,)) for n in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds.sort()
        p50, p99 = seconds[len(seconds) // 2], seconds[int(len(seconds) * 0.99)]
        print(
            f"{args.clients} clients, {len(seconds)} requests: {dict(codes)}; "
            f"p50 {p50:.3f} s, p99 {p99:.3f} s, slowest {seconds[-1]:.3f} s"
        )
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(30)


if __name__ == "__main__":
    main()
