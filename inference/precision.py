"""The number format a model runs in on its device.

`choose` picks it (LANEWAY_PRECISION, default auto): fp16 on CUDA, bf16 on a CPU that
computes bf16 natively, fp16 weights with fp32 arithmetic on another x86 CPU with AVX2
(inference/halfweights.py: a small batch's products read half the bytes), fp32 elsewhere.
On a CPU, bf16 and fp16 name the precision of the matrix products' weights; the residual
stream, LayerNorm and pooling stay in fp32. The start-up check of a reduced precision
against fp32 is inference/accuracy.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference import halfweights

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = ("auto", *DTYPES)
# Capabilities (torch.cpu.get_capabilities) that mean bf16 matrix products in hardware:
# Intel AMX and AVX512-BF16 (also AMD Zen 4+), Arm's BF16 and SVE-BF16 extensions.
BF16_CAPABILITIES = ("amx_bf16", "avx512_bf16", "bf16", "sve_bf16")


def native_bf16_cpu() -> bool:
    """Whether this CPU computes bf16 natively, as torch's cpuinfo sees it.

    torch.cpu.get_capabilities() is public (torch >= 2.8); oneDNN's own
    `_is_mkldnn_bf16_supported` is not used: it says yes on any AVX512 CPU, where bf16 is
    emulated and slower than fp32.
    """
    if not torch.backends.mkldnn.is_available():
        return False
    caps = torch.cpu.get_capabilities()
    return any(bool(caps.get(name, False)) for name in BF16_CAPABILITIES)


def runs_natively(precision: str, device_type: str) -> bool:
    """Whether `device_type` computes `precision` in hardware (fp32 always does)."""
    if precision == "fp32":
        return True
    if device_type == "cuda":
        return precision == "fp16" or torch.cuda.is_bf16_supported()
    if precision == "fp16":
        return halfweights.available()
    return precision == "bf16" and native_bf16_cpu()


@dataclass(frozen=True)
class Choice:
    """The precision a worker loads, and why it is not the one asked for ("" when it is)."""

    precision: str
    fallback: str = ""


def choose(setting: str, device_type: str, cuda_half: bool = True) -> Choice:
    """auto: fp16 on CUDA (fp32 where the deprecated LANEWAY_CUDA_HALF=false), bf16 on a
    CPU with native bf16, fp16 weights on another CPU that runs them (AVX2), else fp32. An
    explicit precision the device does not compute natively falls back to fp32, with the
    reason: a fleet-wide LANEWAY_PRECISION=bf16 meant for some workers must not stop (or
    crawl on) another."""
    if setting not in PRECISIONS:
        raise ValueError(f"unknown precision {setting!r}: expected one of {', '.join(PRECISIONS)}")
    if setting == "auto":
        if device_type == "cuda":
            return Choice("fp16" if cuda_half else "fp32")
        if native_bf16_cpu():
            return Choice("bf16")
        return Choice("fp16" if halfweights.available() else "fp32")
    if runs_natively(setting, device_type):
        return Choice(setting)
    return Choice("fp32", f"{setting} is not computed natively on {device_type}")


def runtime_label(precision: str, device_type: str) -> str:
    """What a chunk ran on, e.g. 'torch 2.13.0 bf16 cpu'."""
    return f"torch {torch.__version__.split('+')[0]} {precision} {device_type}"
