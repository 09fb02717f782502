"""The pricing rule, in one place: CPU stages (pre- and post-processing) at the CPU price,
the model stage at the price of the device it ran on (GPU-seconds on CUDA, CPU-seconds
otherwise). A job's cost (db/results.job_cost) and the dashboard's cost per item
(webapp/jobviews.py) both apply it."""

from __future__ import annotations


def model_price(device: str | None, cpu_price: float, gpu_price: float) -> float:
    """The price of a second of the model stage on `device`."""
    return gpu_price if device == "cuda" else cpu_price


def cost(
    cpu_seconds: float, model_seconds: float, device: str | None, cpu_price: float, gpu_price: float
) -> float:
    """Dollars for `cpu_seconds` of CPU stages and `model_seconds` of the model on `device`."""
    return cpu_seconds * cpu_price + model_seconds * model_price(device, cpu_price, gpu_price)
