"""The command line of each Laneway process, and the fleets the CLI assembles from them."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from core.config.settings import Settings
from core.vocab import INTERACTIVE_PREFIX
from fleet.supervisor import ALWAYS, ON_DEMAND, Fleet
from workers.cores import openmp_env

log = logging.getLogger("fleet.supervisor")


def log_level() -> str:
    """The level celery and gunicorn log at: `laneway --log-level` (LANEWAY_LOG_LEVEL),
    else INFO."""
    return os.environ.get("LANEWAY_LOG_LEVEL", "INFO").upper()


def worker_queues(lane: str) -> str:
    """The cpu worker also serves the maintenance queue: the reconciler, alerts and
    scale-down, short tasks that never wait behind the lanes' chunks. An interactive
    worker (`interactive.cpu` or `interactive.gpu`) serves its queue alone."""
    return "cpu,maintenance" if lane == "cpu" else lane


def worker_argv(
    lane: str, settings: Settings, concurrency: int | None = None, name: str | None = None
) -> list[str]:
    argv = [
        sys.executable, "-m", "celery", "-A", "tasks", "worker",
        "-Q", worker_queues(lane),
        "-n", f"{name or lane}@%h",
        "--loglevel", log_level(),
        "-E",
        # Mingle asks every other worker for its revoked tasks and waits a second for the
        # answers; gossip has each worker follow all the others' events. Laneway revokes no
        # task and elects no leader (Postgres holds the state), so a worker starts a
        # second sooner (a gpu worker's cold start) and spends nothing on its neighbours.
        "--without-mingle", "--without-gossip",
    ]  # fmt: skip
    if lane == "gpu":
        # One chunk at a time per device, and one message prefetched at most.
        return [*argv, "-c", "1", "--prefetch-multiplier", "1"]
    if lane.startswith(INTERACTIVE_PREFIX):
        # Threads that wait on the process's one batcher (and its one copy of the model);
        # as many messages reserved as threads to wait on them.
        threads = concurrency or settings.interactive_threads
        return [*argv, "-P", "threads", "-c", str(threads), "--prefetch-multiplier", "1"]
    return [*argv, "-c", str(concurrency or settings.worker_concurrency)]


def worker_env(lane: str, settings: Settings) -> dict[str, str]:
    """The environment a lane's worker runs with; raises LaneError when it cannot run."""
    from workers.devices import check_lane

    if lane == "maintenance":
        return {}
    model_lane = lane.removeprefix(INTERACTIVE_PREFIX)
    return {
        "LANEWAY_DEVICE": check_lane(model_lane, settings),
        "LANEWAY_GPU_FALLBACK": settings.gpu_fallback,
        # Idle OpenMP threads spin briefly, then sleep (workers/cores.py).
        **openmp_env(),
    }


# A cpu worker process beside its models' weights: celery's parent and pool child, torch,
# the tokenizers and a chunk's tensors. Each model's weights count twice: the loaded tensors
# and the copy a precision's conversion makes.
WORKER_BASE_BYTES = 768 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# Left for the rest of a host's fleet: the interactive worker counts as one more worker,
# the web app, beat and the supervisor share this.
FLEET_RESERVE_BYTES = 512 << 20
# `auto` starts at most this many: every worker holds its own Postgres pool and copy of
# the models, so a large host runs fewer workers of more threads, not one per core.
AUTO_CPU_WORKERS_MAX = 8


def weights_bytes(settings: Settings) -> int:
    """The size of the weights files of the models this fleet's tasks run."""
    from inference.encoder import default_model_path

    folders = {
        Path(spec.path or default_model_path())
        for spec in filter(None, (settings.model_for(task) for task in settings.task_models))
    }
    total = 0
    for folder in folders:
        for file in folder.iterdir() if folder.is_dir() else ():
            if file.suffix in WEIGHT_SUFFIXES and file.is_file():
                total += file.stat().st_size
    return total


def cpu_worker_count(
    settings: Settings, cores: int | None = None, memory: int | None = None
) -> int:
    """How many cpu workers `laneway fleet` keeps on this host: LANEWAY_CPU_WORKERS, or for
    `auto` one per usable core (per LANEWAY_TORCH_THREADS cores where that is set), at most
    AUTO_CPU_WORKERS_MAX, and no more than the host's available memory holds beside the
    rest of the fleet, never none. Processes, not threads: a worker's Python between
    micro-batches (tokenizing, writing results, its claims) holds its GIL, and while one
    worker is there another computes."""
    if settings.cpu_workers != "auto":
        return settings.cpu_workers
    from core.config.host import available_memory, usable_cores

    cores = usable_cores() if cores is None else cores
    chosen = "torch_threads" in settings.model_fields_set
    count = min(AUTO_CPU_WORKERS_MAX, cores // settings.torch_threads if chosen else cores)
    memory = available_memory() if memory is None else memory
    if memory is not None:
        each = WORKER_BASE_BYTES + 2 * weights_bytes(settings)
        count = min(count, (memory - FLEET_RESERVE_BYTES - each) // each)
    return max(1, count)


def cpu_worker_env(settings: Settings, count: int) -> dict[str, str]:
    """The environment of each of `count` cpu workers on this host. They share its cores:
    each takes cores / count torch threads, unless LANEWAY_TORCH_THREADS is set (then the
    operator has chosen). At the default every worker would take every core, and two such
    on one host only contend (docs/operations.md, Sizing)."""
    return {**worker_env("cpu", settings), **thread_share(settings, count)}


def thread_share(settings: Settings, count: int) -> dict[str, str]:
    """LANEWAY_TORCH_THREADS for each of `count` cpu workers sharing this host's cores
    (cores / count), or nothing: one worker, or the operator's own setting."""
    if count > 1 and "torch_threads" not in settings.model_fields_set:
        return {"LANEWAY_TORCH_THREADS": str(max(1, settings.torch_threads // count))}
    return {}


def gpu_devices(settings: Settings) -> tuple[str, ...]:
    """LANEWAY_GPU_DEVICES, else every CUDA device found; on a machine without CUDA, with
    LANEWAY_GPU_FALLBACK=cpu, one stand-in device `0` (its worker runs on CPU)."""
    from workers.devices import cuda_device_count

    if settings.gpu_devices:
        return settings.gpu_devices
    found = cuda_device_count()
    if found:
        return tuple(str(d) for d in range(found))
    return ("0",) if settings.gpu_fallback == "cpu" else ()


def gpu_worker(settings: Settings, device: str) -> tuple[str, list[str], dict[str, str]]:
    """Node name, argv and environment of the worker pinned to one device: the device is
    in CUDA_VISIBLE_DEVICES before the process starts, so torch never sees another."""
    name = f"gpu{device}"
    env = {**worker_env("gpu", settings), "CUDA_VISIBLE_DEVICES": device}
    return name, worker_argv("gpu", settings, name=name), env


def interactive_worker(
    settings: Settings,
    lane: str,
    device: str | None = None,
    name: str | None = None,
    threads: int | None = None,
) -> tuple[str, list[str], dict[str, str]]:
    """Node name, argv and environment of the interactive worker of `lane` (cpu or gpu);
    on gpu it is pinned like a gpu worker, to `device` (default the first gpu device)."""
    queue = INTERACTIVE_PREFIX + lane
    env = worker_env(queue, settings)
    if lane == "gpu":
        devices = (device,) if device is not None else gpu_devices(settings)[:1]
        if not devices:
            from workers.devices import LaneError

            raise LaneError("no gpu device to pin the interactive gpu worker to")
        env["CUDA_VISIBLE_DEVICES"] = devices[0]
        name = name or f"interactive-gpu{devices[0]}"
    name = name or "interactive"
    return name, worker_argv(queue, settings, threads, name), env


def interactive_lanes(settings: Settings) -> tuple[str, ...]:
    """The lanes this machine keeps an interactive worker for: LANEWAY_INTERACTIVE_LANES,
    else cpu, plus gpu where a CUDA device is (not in CPU fallback: a second CPU worker
    would only compete with the first)."""
    if settings.interactive_lanes:
        return settings.interactive_lanes
    from workers.devices import cuda_device_count

    return ("cpu", "gpu") if cuda_device_count() else ("cpu",)


ACCESS_LOG_FORMAT = '%(h)s %(t)s "%(r)s" %(s)s %(b)s %(M)sms "%(a)s"'


def web_argv(settings: Settings, host: str, port: int) -> list[str]:
    return [
        sys.executable, "-m", "gunicorn",
        "--bind", f"{host}:{port}",
        "--workers", str(settings.web_workers),
        "--threads", str(settings.web_threads),
        "--access-logfile", "-",
        "--log-level", log_level().lower(),
        # The default format logs a Basic-auth user name, which could be an API key.
        "--access-logformat", ACCESS_LOG_FORMAT,
        # Its hooks: what a worker made at start is kept out of the collector's walks.
        "--config", "python:webapp.gunicorn_hooks",
        "webapp:create_app()",
    ]  # fmt: skip


def beat_argv(settings: Settings) -> list[str]:
    settings.home.mkdir(parents=True, exist_ok=True)
    return [
        sys.executable, "-m", "celery", "-A", "tasks", "beat",
        "--schedule", str(settings.home / "celerybeat-schedule"),
        "--loglevel", log_level(),
    ]  # fmt: skip


def flower_argv(settings: Settings, host: str, port: int, max_tasks: int) -> list[str]:
    """Flower on the broker. It keeps the tasks it has seen in memory: --max_tasks bounds
    them. Nothing persists: its --db file (only used with --persistent) stays under
    LANEWAY_HOME, never in the working directory."""
    settings.home.mkdir(parents=True, exist_ok=True)
    return [
        sys.executable, "-m", "celery", "-A", "tasks", "flower",
        f"--address={host}",
        f"--port={port}",
        f"--max_tasks={max_tasks}",
        "--persistent=False",
        f"--db={settings.home / 'flower.db'}",
    ]  # fmt: skip


def node(name: str) -> str:
    return f"{name}@{socket.gethostname()}"


def add_gpu_workers(fleet: Fleet, settings: Settings, devices: Sequence[str], policy: str) -> None:
    from fleet.devicelock import lock_path

    for device in devices:
        name, argv, env = gpu_worker(settings, device)
        lock = lock_path(settings.home, device)
        fleet.add(f"worker-{name}", argv, env, policy=policy, node=node(name), lock=lock)


def add_workers(fleet: Fleet, settings: Settings) -> tuple[str, ...]:
    """The cpu workers and the interactive worker (always up) and a gpu worker per device
    (started on demand)."""
    count = cpu_worker_count(settings)
    log.info("%d cpu workers on this host (LANEWAY_CPU_WORKERS=%s)", count, settings.cpu_workers)
    env = cpu_worker_env(settings, count)
    for n in range(count):
        name = "cpu" if n == 0 else f"cpu{n + 1}"
        argv = worker_argv("cpu", settings, name=name)
        fleet.add(f"worker-{name}", argv, dict(env), ALWAYS, node(name))
    # Interactive workers: always up, so a first request never waits for a start.
    for lane in interactive_lanes(settings):
        name, argv, env = interactive_worker(settings, lane)
        fleet.add(f"worker-{name}", argv, env, ALWAYS, node(name))
    devices = gpu_devices(settings)
    if not devices:
        log.warning("no CUDA device and no LANEWAY_GPU_FALLBACK=cpu: this fleet runs no gpu worker")
    add_gpu_workers(fleet, settings, devices, ON_DEMAND)
    return devices


def gpu_depth_reader(settings: Settings):  # noqa: ANN201
    """The gpu lane's depth (queued + reserved + running), for scale-from-zero."""
    from core.queueing.broker import depth

    return lambda: depth(settings, "gpu")["depth"]


class FleetReporter:
    """Tells routing (through Redis) how many gpu devices this machine can start workers
    on, every `every` seconds while the fleet runs, and takes the report back when it
    stops: a stopped fleet starts nothing, and its report would steer routing for as long
    as it lived."""

    def __init__(self, settings: Settings, devices: int, every: float = 10.0) -> None:
        from core.store.redis_conn import redis_client

        self.redis = redis_client(settings)
        self.devices, self.every = devices, every
        self.host = socket.gethostname()
        self.last = 0.0

    def __call__(self, _fleet: Fleet) -> None:
        from jobs.lanes import publish_fleet

        if time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        try:
            publish_fleet(self.redis, self.host, self.devices, ttl=int(3 * self.every))
        except Exception as exc:  # noqa: BLE001 - routing falls back to the threshold
            log.warning("could not report the fleet's devices: %s", type(exc).__name__)

    def withdraw(self, _fleet: Fleet) -> None:
        from jobs.lanes import withdraw_fleet

        try:
            withdraw_fleet(self.redis, self.host)
        except Exception as exc:  # noqa: BLE001 - the report expires by itself
            log.warning("could not withdraw the fleet's report: %s", type(exc).__name__)


def worker_fleet(settings: Settings, log_dir: Path | None = None) -> Fleet:
    """`laneway fleet`: this machine's workers, gpu ones scaled from zero."""
    from workers.devices import cuda_device_count

    fleet = Fleet(log_dir=log_dir, gpu_depth=gpu_depth_reader(settings))
    devices = add_workers(fleet, settings)
    # Routing is told of GPUs that exist: CUDA's, or the devices an operator names
    # (LANEWAY_GPU_DEVICES). Without either, the gpu lane's stand-in worker runs on CPU,
    # slower than the cpu lane and only after a cold start: telling routing it exists sent
    # large jobs to wait for it while the cpu workers idled.
    real = cuda_device_count() or settings.gpu_devices
    reporter = FleetReporter(settings, len(devices) if real else 0)
    fleet.on_step, fleet.on_stop = reporter, reporter.withdraw
    return fleet


def one_machine_settings(settings: Settings) -> Settings:
    """On a machine without CUDA the gpu lane still needs a consumer: run it on CPU."""
    from workers.devices import cuda_available

    if cuda_available() or settings.gpu_fallback == "cpu":
        return settings
    log.warning("no CUDA device found: gpu workers run on CPU (LANEWAY_GPU_FALLBACK=cpu)")
    os.environ["LANEWAY_GPU_FALLBACK"] = "cpu"
    return Settings.from_env({**os.environ})


def full_fleet(settings: Settings, host: str, port: int, log_dir: Path | None = None) -> Fleet:
    """`laneway up`: migrations, then web, beat and this machine's workers."""
    from db.migrate import upgrade

    upgrade(settings)
    settings = one_machine_settings(settings)
    fleet = worker_fleet(settings, log_dir)
    fleet.add("web", web_argv(settings, host, port))
    fleet.add("beat", beat_argv(settings))
    fleet.start_always()
    return fleet
