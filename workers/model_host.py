"""Models per worker child process, loaded after the fork (CUDA cannot survive one)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery.signals import worker_process_init

from core.config.settings import ModelSpec, Settings, get_settings
from core.vocab import TASKS
from workers.devices import model_device
from workers.identity import is_interactive, worker_queues
from workers.registry import instance_id, ready

log = logging.getLogger(__name__)
_lock = threading.Lock()
_models: dict[tuple[Any, ...], Any] = {}
_pipelines: dict[tuple[Any, ...], Any] = {}
# Where the precision check's verdicts are kept, under LANEWAY_MODEL_CACHE_DIR (default
# LANEWAY_HOME; inference/accuracy.py).
PRECISION_VERDICTS = "precision-checks"
# Where the interactive worker's ONNX exports are kept, beside them (inference/lone.py).
ONNX_EXPORTS = "onnx-exports"


def load_model(spec: ModelSpec, settings: Settings, device: str) -> Any:
    """Load one registry entry on `device`, once per process, in the precision chosen for
    the device and checked against fp32 (inference/precision.py)."""
    key = (os.getpid(), spec, device, settings.batch_size, settings.precision, settings.cuda_half)
    with _lock:
        if key not in _models:
            import torch

            from inference.accuracy import TOLERANCE, Verdicts, load_checked
            from inference.encoder import default_model_path
            from inference.precision import choose

            torch.set_num_threads(settings.torch_threads)
            choice = choose(settings.precision, torch.device(device).type, settings.cuda_half)
            if choice.fallback:
                log.warning(
                    "model %s: LANEWAY_PRECISION=%s, but %s: loading fp32",
                    spec.name, settings.precision, choice.fallback,
                )  # fmt: skip
            verdict_key = Verdicts.key(
                spec.path or default_model_path(),
                choice.precision,
                device,
                settings.score_anchors,
                TOLERANCE,
                kind=spec.kind,
                labels=spec.labels,
                max_length=_build_args(spec, settings, device, choice.precision)["max_length"],
                batch_size=settings.batch_size,
            )
            model = load_checked(
                lambda precision: _build(spec, settings, device, precision),
                choice.precision,
                settings.score_anchors,
                name=f"model {spec.name}",
                verdicts=Verdicts(settings.model_cache_dir / PRECISION_VERDICTS),
                key=verdict_key,
            )
            runtime = model.runtime
            if hasattr(model, "run_lone_texts") and is_interactive(worker_queues()):
                # A lone request's text, on every core (inference/lone.py).
                from inference.lone import Exports

                exports = Exports(settings.model_cache_dir / ONNX_EXPORTS)
                lone = model.run_lone_texts(settings.lone_runtime, settings.torch_threads, exports)
                runtime = f"{runtime}; one text alone: {lone}"
            _models[key] = model
            log.info(
                "model %s (%s) loaded in pid %s on %s with %s torch threads: %s",
                spec.name,
                spec.kind,
                os.getpid(),
                device,
                settings.torch_threads,
                runtime,
            )
        return _models[key]


def _build_args(spec: ModelSpec, settings: Settings, device: str, precision: str) -> dict:
    return {
        "device": device,
        "max_length": min(spec.max_length, settings.max_length)
        if spec.kind == "embedding"
        else spec.max_length,
        "batch_size": settings.batch_size,
        "precision": precision,
    }


def _build(spec: ModelSpec, settings: Settings, device: str, precision: str) -> Any:
    """One registry entry's model class, loaded on `device` in `precision`."""
    common = _build_args(spec, settings, device, precision)
    if spec.kind == "embedding":
        from inference.encoder import Encoder

        return Encoder(spec.path or None, **common)
    if spec.kind == "sequence-classification":
        from inference.seqcls import SequenceClassifier

        return SequenceClassifier(spec.path, labels=spec.labels, **common)
    from inference.ner import TokenClassifier

    return TokenClassifier(spec.path, labels=spec.labels, **common)


def get_pipeline(settings: Settings | None = None):  # noqa: ANN201
    """This process's pipeline; models load on first use by the tasks that need them."""
    from inference.pipeline import Pipeline

    settings = settings or get_settings()
    device = model_device(settings)
    key = (os.getpid(), id(settings), device)
    if key not in _pipelines:
        # Each batch asks for its tasks' models: found once per task, not per batch (the
        # look-up reads the registry and hashes the model's key under a lock).
        resolved: dict[str, Any] = {}

        def resolve(task: str) -> Any:
            if task not in resolved:
                spec = settings.model_for(task)
                resolved[task] = None if spec is None else load_model(spec, settings, device)
            return resolved[task]

        _pipelines[key] = Pipeline(resolve, settings.score_anchors)
    return _pipelines[key]


def warm_up(settings: Settings | None = None) -> None:
    """Load every model the configured tasks use, so no chunk pays for a load."""
    settings = settings or get_settings()
    pipeline = get_pipeline(settings)
    for task in TASKS:
        pipeline.resolve(task)


MODEL_QUEUES = ("cpu", "gpu")


@worker_process_init.connect
def _load_in_child(**_: Any) -> None:
    # A worker serving only the maintenance queue never runs a model: it loads none.
    queues = worker_queues()
    if queues is None or set(queues) & set(MODEL_QUEUES):
        warm_up()
    if queues and "gpu" in queues:
        check_device_or_stop()
    if queues is not None:
        try:
            ready(instance_id())
        except Exception as exc:  # noqa: BLE001 - bookkeeping only
            log.warning("could not record the worker as ready: %s", type(exc).__name__)


def check_device_or_stop(worker_pid: int | None = None) -> None:
    """A worker pinned to a GPU proves its device works before it takes work: a small
    tensor operation on it. On failure the whole worker (the pool's parent, or
    `worker_pid`) stops, and its supervisor sees why."""
    import signal

    from workers.health import device_check

    device = model_device(get_settings())
    try:
        report = device_check(device)
    except Exception as exc:  # noqa: BLE001 - any failure means the device is unusable
        report = {"device": device, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if report["ok"]:
        log.info("device check passed: %s", report)
        return
    log.critical("device check failed, stopping the worker: %s", report)
    os.kill(worker_pid or os.getppid(), signal.SIGTERM)
