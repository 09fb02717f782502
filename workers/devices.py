"""Which device a lane's worker runs its model on, decided without initializing CUDA."""

from __future__ import annotations

import os

from core.config.settings import Settings


class LaneError(RuntimeError):
    """A worker cannot serve the lane it was asked to serve."""


def cuda_available() -> bool:
    # NVML answers without creating a CUDA context, so a prefork parent can ask safely.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    return torch.cuda.is_available()


def cuda_device_count() -> int:
    """CUDA devices on this machine, counted without creating a CUDA context."""
    if not cuda_available():
        return 0
    import torch

    return torch.cuda.device_count()


def check_lane(lane: str, settings: Settings) -> str:
    """The device a worker of `lane` will use: `cuda` or `cpu`; raise LaneError if none fits."""
    if lane == "cpu":
        return "cpu"
    if cuda_available():
        return "cuda"
    if settings.gpu_fallback == "cpu":
        return "cpu"
    raise LaneError(
        "the gpu lane needs a CUDA device and none was found; set LANEWAY_GPU_FALLBACK=cpu "
        "to run gpu-lane chunks on the CPU"
    )


def model_device(settings: Settings) -> str:
    """The device this worker process loads its model on (LANEWAY_DEVICE, default auto)."""
    if settings.device == "cuda" and not cuda_available():
        raise LaneError("LANEWAY_DEVICE=cuda but no CUDA device is available")
    if settings.device == "auto":
        return "cuda" if cuda_available() else "cpu"
    return settings.device
