"""A health check that really touches the device: a small tensor operation on it."""

from __future__ import annotations

import os
import time
from typing import Any


def device_check(device: str) -> dict[str, Any]:
    """Multiply a small matrix on `device` and compare with the known answer."""
    import torch

    dev = torch.device(device)
    rows = [[float(4 * i + j) for j in range(4)] for i in range(4)]
    expected = sum(sum(a * b for a, b in zip(r, q, strict=True)) for r in rows for q in rows)
    started = time.perf_counter()
    x = torch.arange(16, dtype=torch.float32, device=dev).reshape(4, 4)
    total = float((x @ x.T).sum().item())  # .item() waits for the device
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        name = torch.cuda.get_device_name(dev)
    else:
        name = "cpu"
    return {
        "device": str(dev),
        "name": name,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "ok": total == expected,
        "ms": round(1000 * (time.perf_counter() - started), 3),
        "pid": os.getpid(),
    }
