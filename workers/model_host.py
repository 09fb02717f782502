"""One model per worker child process, loaded after the fork (CUDA cannot survive one)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery.signals import worker_process_init

from laneway.settings import Settings, get_settings
from workers.devices import model_device

log = logging.getLogger(__name__)
_lock = threading.Lock()
_models: dict[tuple[Any, ...], Any] = {}


def get_classifier(settings: Settings | None = None):  # noqa: ANN201
    """This process's zero-shot classifier, loaded on first use."""
    settings = settings or get_settings()
    device = model_device(settings)
    key = (os.getpid(), settings.model_path, device, settings.max_length, settings.batch_size)
    with _lock:
        if key not in _models:
            import torch

            from inference import Encoder, ZeroShotClassifier

            torch.set_num_threads(settings.torch_threads)
            encoder = Encoder(
                settings.model_path or None,
                device=device,
                max_length=settings.max_length,
                batch_size=settings.batch_size,
            )
            _models[key] = ZeroShotClassifier(encoder)
            log.info(
                "model loaded in pid %s on %s with %s torch threads",
                os.getpid(),
                device,
                settings.torch_threads,
            )
        return _models[key]


@worker_process_init.connect
def _load_in_child(**_: Any) -> None:
    # Warm the model in each fresh child so the first chunk does not pay for the load.
    get_classifier()
