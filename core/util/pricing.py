"""The pricing rule, in one place: CPU stages (pre- and post-processing) at the CPU price,
the model stage at the price of the device it ran on (GPU-seconds on CUDA, CPU-seconds
otherwise). LANEWAY_CPU_PRICE is a core-second's, as `laneway plan` prices provisioned
cores: a worker's CPU second costs the `cores` it holds (its torch threads), so the same
work costs the same whether one worker holds a host's cores or several share them. A job's
cost (db/results.job_cost), routing's estimate (jobs/planner.py) and the dashboard's cost
per item (webapp/jobviews.py) all apply it."""

from __future__ import annotations


def model_price(
    device: str | None, cpu_price: float, gpu_price: float, cores: float = 1.0
) -> float:
    """The price of a second of the model stage on `device`, by a worker holding `cores`
    (a GPU's second is the device's)."""
    return gpu_price if device == "cuda" else cpu_price * cores


def cost(
    cpu_seconds: float,
    model_seconds: float,
    device: str | None,
    cpu_price: float,
    gpu_price: float,
    cores: float = 1.0,
) -> float:
    """Dollars for `cpu_seconds` of CPU stages and `model_seconds` of the model on `device`,
    by a worker holding `cores`."""
    return cpu_seconds * cpu_price * cores + model_seconds * model_price(
        device, cpu_price, gpu_price, cores
    )
