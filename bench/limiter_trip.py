"""The rate limiter's cost per request in the web process (issue 19): Flask-Limiter takes a
request from the sliding window, then reads the window for the RateLimit-* headers. With
`limits`' own Redis storage that is two round trips; with Laneway's
(webapp/ratelimit_storage.py) one. Prints the CPU and wall time of both per request,
alternating, against the Redis at LANEWAY_REDIS_URL (db 13 by default: keys under
`LIMITS:`, expiring within two minutes).

    .venv/bin/python bench/limiter_trip.py [--requests 3000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from limits import RateLimitItemPerMinute  # noqa: E402
from limits.storage import storage_from_string  # noqa: E402
from limits.strategies import SlidingWindowCounterRateLimiter  # noqa: E402

from webapp.security import limiter_storage_url  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    url = os.environ.get("LANEWAY_REDIS_URL", "redis://127.0.0.1:6379/13")
    ours = limiter_storage_url(url)
    storages = {"limits' RedisStorage": url, "webapp/ratelimit_storage.py": ours}
    limiters = {
        k: SlidingWindowCounterRateLimiter(storage_from_string(v)) for k, v in storages.items()
    }
    item = RateLimitItemPerMinute(10**9)
    for _ in range(3):
        for name, limiter in limiters.items():
            for _ in range(200):  # scripts loaded, connections made
                limiter.hit(item, "bench", name)
                limiter.get_window_stats(item, "bench", name)
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(args.requests):
                limiter.hit(item, "bench", name)
                limiter.get_window_stats(item, "bench", name)
            cpu = (time.process_time() - cpu) / args.requests * 1e6
            wall = (time.perf_counter() - wall) / args.requests * 1e6
            print(f"{name}: hit + window per request: {cpu:.0f} us CPU, {wall:.0f} us wall")


if __name__ == "__main__":
    main()
