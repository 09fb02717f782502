"""Model code: pre-processing, the models, post-processing. Imports neither Celery nor Flask.

`Encoder`, `Pipeline` and `default_model_path` are read from their modules on first use:
importing a torch-free part (inference.stages) must not import torch and transformers.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["Encoder", "Pipeline", "default_model_path"]

_HOMES = {
    "Encoder": "inference.encoder",
    "default_model_path": "inference.encoder",
    "Pipeline": "inference.pipeline",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'inference' has no attribute {name!r}")
    return getattr(import_module(_HOMES[name]), name)
