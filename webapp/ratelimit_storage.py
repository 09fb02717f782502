"""The rate limiter's Redis storage, one round trip per request.

Flask-Limiter (over the `limits` library) asks Redis twice for each request under a
sliding-window-counter limit: once to take the request from the window (a Lua script), then
again for the window's counts, to write the `RateLimit-*` headers; that second trip is one
of the web process's largest own costs on the interactive path. This storage is `limits`'
own `RedisStorage` with one change: taking a request runs one script that also returns the
window as it left it, and the header's read that follows on the same thread, for the same
key, within a second, gets those counts instead of asking again. The limit itself is decided
in Redis as `limits` decides it (the same arithmetic as its acquire script), so every web
process shares each account's window.

It registers itself with `limits` under the `laneway+` schemes
(`laneway+redis://host:port/db`, `laneway+redis+unix:///path`).
"""

from __future__ import annotations

import threading
import time

from limits.storage import RedisStorage

PREFIX = "laneway+"
FRESH = 1.0  # seconds a window read with a hit answers the header's read

# limits' acquire_sliding_window.lua (KEYS[1], KEYS[2]: the previous and current windows;
# ARGV: limit, expiry in seconds, amount), leaving `acquired` (0/1) and the window as it
# leaves it. The scripts below end it with what they do with the verdict.
ACQUIRE = """
local limit = tonumber(ARGV[1])
local expiry = tonumber(ARGV[2]) * 1000
local amount = tonumber(ARGV[3])

local current_ttl = tonumber(redis.call('pttl', KEYS[2]))
if current_ttl > 0 and current_ttl < expiry then
    -- Current window expired, shift it to the previous window
    redis.call('rename', KEYS[2], KEYS[1])
    redis.call('set', KEYS[2], 0, 'PX', current_ttl + expiry)
end

local previous_count = tonumber(redis.call('get', KEYS[1])) or 0
local previous_ttl = tonumber(redis.call('pttl', KEYS[1])) or 0
local current_count = tonumber(redis.call('get', KEYS[2])) or 0
current_ttl = tonumber(redis.call('pttl', KEYS[2])) or 0
if previous_ttl <= 0 then
    previous_ttl = 0
end
if current_ttl <= 0 then
    current_ttl = 0
end

local acquired = 0
local weighted_count = math.floor(previous_count * previous_ttl / expiry) + current_count
if amount <= limit and (weighted_count + amount) <= limit then
    if redis.call('exists', KEYS[2]) == 1 then
        current_count = redis.call('incrby', KEYS[2], amount)
    else
        redis.call('set', KEYS[2], amount, 'PX', expiry * 2)
        current_count = amount
    end
    current_ttl = tonumber(redis.call('pttl', KEYS[2]))
    acquired = 1
end
"""
WINDOW = "return {acquired, previous_count, previous_ttl, current_count, current_ttl}\n"
# The verdict and the window it leaves: {acquired (0/1), previous count, previous TTL ms,
# current count, current TTL ms}.
ACQUIRE_AND_READ = ACQUIRE + WINDOW


class OneTripRedisStorage(RedisStorage):
    """`RedisStorage` whose sliding-window hit also reads the window it leaves."""

    STORAGE_SCHEME = [PREFIX + "redis", PREFIX + "rediss", PREFIX + "redis+unix"]

    def __init__(self, uri: str, **options: float | str | bool) -> None:
        self._seen = threading.local()
        super().__init__(uri.removeprefix(PREFIX), **options)

    def initialize_storage(self, uri: str) -> None:
        super().initialize_storage(uri)
        self.lua_acquire_and_read = self.get_connection().register_script(ACQUIRE_AND_READ)

    def window_keys(self, key: str) -> list[str]:
        """The Redis keys of a limit key's previous and current windows (the scripts' KEYS)."""
        return [
            self.prefixed_key(self._previous_window_key(key)),
            self.prefixed_key(self._current_window_key(key)),
        ]

    def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: int, amount: int = 1
    ) -> bool:
        verdict = self.lua_acquire_and_read(self.window_keys(key), [limit, expiry, amount])
        return self.remember(key, expiry, verdict)

    def remember(self, key: str, expiry: int, verdict: list[int]) -> bool:
        """Keep the window a hit left (an ACQUIRE script's `WINDOW`) for the header's read
        that follows on this thread; whether the hit was acquired."""
        acquired, previous, previous_ttl, current, current_ttl = verdict
        window = (
            int(previous),
            max(0, previous_ttl) / 1000,
            int(current),
            max(0, current_ttl) / 1000,
        )
        self._seen.last = (key, expiry, time.monotonic(), window)
        return bool(acquired)

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        seen, self._seen.last = getattr(self._seen, "last", None), None
        if seen is not None:
            seen_key, seen_expiry, at, window = seen
            age = time.monotonic() - at
            if seen_key == key and seen_expiry == expiry and age < FRESH:
                # The TTLs have run on since the hit: as a second read would have seen them.
                previous, previous_ttl, current, current_ttl = window
                return previous, max(0.0, previous_ttl - age), current, max(0.0, current_ttl - age)
        return super().get_sliding_window(key, expiry)
