"""Matrix products with fp16 weights and fp32 arithmetic, for CPUs without native bf16.

On such a CPU (AVX2 x86: AMD Zen 2/3, most Intel parts before Sapphire Rapids) a small
batch's products are bound by reading the weights, not by arithmetic: one text of 16
tokens reads all 42 MB of MiniLM's layers for 0.7 GFLOP. FBGEMM's fp16 GEMM (torch's
`quantized::linear_dynamic_fp16`, the kernel behind torch's dynamic fp16 quantization)
keeps the weights in fp16, packed once into its layout, converts them to fp32 in
registers (F16C) and multiplies in fp32: half the bytes to read, the same arithmetic. The
gain shrinks as rows grow, and a large product is bound by arithmetic, where FBGEMM's fp16
kernel trails MKL's; so a product above `HALF_ROWS` rows runs on the fp32 weights, which
are kept beside the fp16 copy (`bench/calibrate.py half-rows` re-derives the crossover).

fp16 keeps 11 significant bits where bf16 keeps 8: a MiniLM embedding stays within cosine
0.9999997 of fp32's (bf16 products: 0.99997); the worker's start-up check
(inference/accuracy.py) compares it with fp32 as it does bf16.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

# Above this many rows a product runs on the fp32 weights (faster there, see above);
# `bench/calibrate.py half-rows` re-derives it for a CPU.
HALF_ROWS = 512


def engines() -> list[str]:
    """The quantized engines this torch build has (FBGEMM's on x86 builds)."""
    return list(torch.backends.quantized.supported_engines)


def available() -> bool:
    """Whether this torch build and CPU run FBGEMM's fp16-weight products: an x86 CPU with
    AVX2 and F16C (FBGEMM's minimum), and a build with the FBGEMM quantized engine."""
    if "fbgemm" not in engines():
        return False
    caps = torch.cpu.get_capabilities()
    return bool(caps.get("avx2")) and bool(caps.get("f16c", True))


def pack(weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    """The fp16 copy of a linear layer's weight, in FBGEMM's layout (with its fp32 bias)."""
    return torch.ops.quantized.linear_prepack_fp16(
        weight.detach().float().contiguous(),
        None if bias is None else bias.detach().float().contiguous(),
    )


def linear(x: torch.Tensor, packed: Any, weight: torch.Tensor, bias: torch.Tensor | None):
    """`x @ weight.T + bias`: on the fp16 copy up to HALF_ROWS rows, else on `weight`."""
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    # A trace (inference/lone.py's ONNX export) records the fp32 product: FBGEMM's has no
    # ONNX operator.
    if not 0 < rows <= HALF_ROWS or x.dtype != torch.float32 or torch.jit.is_tracing():
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    out = torch.ops.quantized.linear_dynamic_fp16(flat, packed)
    return out.reshape(*x.shape[:-1], weight.shape[0])


class HalfWeightLinear(torch.nn.Module):
    """An nn.Linear whose small products run on an fp16 copy of its weight (`linear`)."""

    def __init__(self, layer: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.weight, self.bias = layer.weight, layer.bias
        self.packed = pack(layer.weight, layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.packed, self.weight, self.bias)


def convert(model: torch.nn.Module) -> torch.nn.Module:
    """Every nn.Linear of `model` (transformers' forward) as a HalfWeightLinear, in place."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, HalfWeightLinear(child))
    return model
