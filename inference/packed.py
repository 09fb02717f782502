"""A BERT encoder that computes only the real tokens of a padded batch (inference only).

A batch of texts is padded to its longest, and transformers' BertModel runs every layer on
every position: in a batch of short, uneven texts about half the positions are padding.
`PackedBert` runs the same weights on the real tokens alone, packed into one (tokens,
hidden) matrix: the embeddings, the projections and the feed-forward layers see no padding,
and each text's attention runs over its own tokens, without a mask (one attention over the
padded batch costs more than all the products: the kernel is slow for short heads). The
three attention projections run as one product. On a CPU in bf16 the products use oneDNN
with the weights packed once into its layout (transformers' path reorders them on every
call) and GELU fused into the intermediate product; the residual stream and LayerNorm stay
in fp32, as the mixed precision of inference/base.py keeps them.

It is built from a loaded BertModel (`PackedBert.build`), which it shares weights with, and
checks itself against it on a few texts before it is used: anything else (another
architecture, a GPU, a check that fails) keeps transformers' own forward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from inference import halfweights

log = logging.getLogger(__name__)
# How close the packed forward's mean-pooled vectors must be to transformers' in the same
# precision (cosine, every text of the self-check): the same arithmetic in another order,
# which in bf16 (8 significant bits) rounds differently (it stays near 0.99999, where bf16
# itself is about 0.99997 from fp32); a wrong layout or a lost embedding is far below.
SELF_CHECK_COSINE = {False: 0.999999, True: 0.9999}  # by mixed bf16


def onednn_bf16() -> bool:
    """Whether torch has oneDNN's prepacked linear (what the packed bf16 products use) and
    oneDNN runs bf16 on this CPU (AVX512 at least: on an AVX2 CPU it refuses to pack)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


def padded_rows(tokens: int) -> int:
    """The rows the products run on for `tokens` real tokens: rounded up to one of eight
    steps per power of two (at most 1/8 more). oneDNN builds a kernel for each shape it
    meets, and a server meets a new token count in nearly every batch: with the count
    rounded, a few hundred shapes cover every batch, and its kernel cache holds them (a
    new shape makes a batch markedly slower)."""
    step = 1 << max(0, tokens.bit_length() - 4)
    return -(-tokens // step) * step


@dataclass
class _Product:
    """One linear layer: `x @ weight.T + bias`, with an optional fused activation."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    activation: str = "none"  # "gelu" (erf) fused, or none
    prepacked: bool = False
    half: Any = None  # the weight's fp16 copy (inference/halfweights.py), for small products

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.prepacked:
            algorithm = "none" if self.activation == "gelu" else ""
            return torch.ops.mkldnn._linear_pointwise(
                x.to(torch.bfloat16), self.weight, self.bias, self.activation, [], algorithm
            )
        if self.half is not None:
            out = halfweights.linear(x, self.half, self.weight, self.bias)
        else:
            out = F.linear(x.to(self.weight.dtype), self.weight, self.bias)
        return F.gelu(out) if self.activation == "gelu" else out


@dataclass
class _Layer:
    qkv: _Product
    out: _Product
    norm1: torch.nn.LayerNorm
    up: _Product
    act: Callable[[torch.Tensor], torch.Tensor] | None  # when not fused into `up`
    down: _Product
    norm2: torch.nn.LayerNorm


class PackedBert:
    """A BertModel's forward over real tokens only; `mean_pooled` is what Encoder needs."""

    def __init__(self, model: Any, prepack: bool, half: bool = False) -> None:
        config = model.config
        self.embeddings = model.embeddings
        # Each position's embedding plus type 0's, summed once: what every token of a single
        # text adds to its word's embedding.
        self.type0_positions = (
            self.embeddings.position_embeddings.weight
            + self.embeddings.token_type_embeddings.weight[0]
        ).detach()
        self.heads = int(config.num_attention_heads)
        self.hidden = int(config.hidden_size)
        self.head_size = self.hidden // self.heads
        self.compute_dtype = torch.bfloat16 if prepack else model.dtype
        fuse_gelu = prepack and config.hidden_act == "gelu"
        self.layers = []
        for layer in model.encoder.layer:
            attention = layer.attention.self
            qkv_weight = torch.cat(
                [attention.query.weight, attention.key.weight, attention.value.weight]
            )
            qkv_bias = torch.cat([attention.query.bias, attention.key.bias, attention.value.bias])
            self.layers.append(
                _Layer(
                    qkv=self._product(qkv_weight, qkv_bias, prepack, half),
                    out=self._product(
                        layer.attention.output.dense.weight,
                        layer.attention.output.dense.bias,
                        prepack,
                        half,
                    ),
                    norm1=layer.attention.output.LayerNorm,
                    up=self._product(
                        layer.intermediate.dense.weight,
                        layer.intermediate.dense.bias,
                        prepack,
                        half,
                        "gelu" if fuse_gelu else "none",
                    ),
                    act=None if fuse_gelu else layer.intermediate.intermediate_act_fn,
                    down=self._product(
                        layer.output.dense.weight, layer.output.dense.bias, prepack, half
                    ),
                    norm2=layer.output.LayerNorm,
                )
            )

    @staticmethod
    def _product(
        weight: torch.Tensor,
        bias: torch.Tensor,
        prepack: bool,
        half: bool = False,
        activation: str = "none",
    ) -> _Product:
        weight, bias = weight.detach(), bias.detach()
        if not prepack:
            copy = halfweights.pack(weight, bias) if half else None
            return _Product(weight.contiguous(), bias.contiguous(), activation, half=copy)
        packed = torch.ops.mkldnn._reorder_linear_weight(
            weight.to(torch.bfloat16).contiguous(), None
        )
        return _Product(packed, bias.to(torch.bfloat16).contiguous(), activation, True)

    @classmethod
    def supports(cls, model: Any, device: torch.device) -> str:
        """Why `model` cannot run packed on `device` ("" when it can)."""
        config = getattr(model, "config", None)
        if device.type != "cpu":
            return f"not measured on {device.type}"
        if getattr(config, "model_type", None) != "bert" or not hasattr(model, "encoder"):
            return f"a {getattr(config, 'model_type', type(model).__name__)} model, not BERT"
        if getattr(config, "is_decoder", False):
            return "a decoder"
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            return "relative position embeddings"
        return ""

    @classmethod
    def build(
        cls, model: Any, device: torch.device, mixed_bf16: bool, half: bool = False
    ) -> PackedBert | None:
        """The packed forward of `model`, or None (with the reason logged) where it does not
        apply or does not agree with transformers' forward. `half`: its products read fp16
        copies of the weights where that is faster (inference/halfweights.py)."""
        reason = cls.supports(model, device)
        if reason:
            log.info("transformers' forward kept: %s", reason)
            return None
        try:
            packed = cls(model, prepack=mixed_bf16 and onednn_bf16(), half=half)
            agreement = packed.self_check(model, mixed_bf16)
        except Exception as exc:  # noqa: BLE001 - another transformers release, say
            log.warning("transformers' forward kept: the packed one failed (%s)", exc)
            return None
        if agreement < SELF_CHECK_COSINE[mixed_bf16]:
            log.warning(
                "transformers' forward kept: the packed one agreed to cosine %.6f only",
                agreement,
            )
            return None
        return packed

    def self_check(self, model: Any, mixed_bf16: bool) -> float:
        """The lowest cosine between this forward's pooled vectors and transformers' on a
        padded batch (texts of different lengths, a second segment, a lone token)."""
        generator = torch.Generator().manual_seed(0)
        vocab = int(model.config.vocab_size)
        lengths = [1, 7, 23, 64]
        ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, n in enumerate(lengths):
            ids[row, :n] = torch.randint(1000, vocab, (n,), generator=generator)
            mask[row, :n] = 1
        types = torch.zeros_like(ids)
        types[2, 10:23] = 1
        inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed_bf16)
        with torch.inference_mode(), autocast:
            hidden = model(**inputs).last_hidden_state.float()
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            want = (hidden * weights).sum(1) / weights.sum(1)
            got = self.mean_pooled(inputs)
        return F.cosine_similarity(want, got, dim=1).min().item()

    def mean_pooled(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """(batch, hidden) float32: each text's last hidden states averaged over its tokens."""
        mask = inputs["attention_mask"]
        batch, length = mask.shape
        real = mask.reshape(-1).nonzero().squeeze(1)  # the real tokens' places in batch*length
        counts = mask.sum(1)
        spans = counts.tolist()
        h = self._embedded(inputs, real, length).float()
        tokens = real.numel()
        rows = padded_rows(tokens)
        if self.layers and rows > tokens:
            h = torch.cat([h, h.new_zeros(rows - tokens, self.hidden)])
        for layer in self.layers:
            h = self._layer(layer, h, spans)
        pooled = torch.zeros(batch, self.hidden, dtype=torch.float32)
        pooled.index_add_(0, torch.div(real, length, rounding_mode="floor"), h[:tokens])
        return pooled / counts.unsqueeze(1).clamp(min=1)

    def _embedded(
        self, inputs: dict[str, torch.Tensor], real: torch.Tensor, length: int
    ) -> torch.Tensor:
        """(tokens, hidden): BertEmbeddings' output for the real tokens alone (at places
        `real` of the flattened batch of width `length`). A token's position is its column,
        as BertEmbeddings numbers them; with every type id zero (single texts), the type's
        row is already in `type0_positions`: one gather and one sum fewer per token."""
        embeddings = self.embeddings
        positions = real % length
        h = embeddings.word_embeddings(inputs["input_ids"].reshape(-1).index_select(0, real))
        types = inputs.get("token_type_ids")
        if types is None or not bool(types.any()):
            h += F.embedding(positions, self.type0_positions)
        else:
            h += embeddings.token_type_embeddings(types.reshape(-1).index_select(0, real))
            h += embeddings.position_embeddings(positions)
        return embeddings.LayerNorm(h)

    def _layer(self, layer: _Layer, h: torch.Tensor, spans: list[int]) -> torch.Tensor:
        qkv = layer.qkv(h)
        parts, start = [], 0
        for n in spans:  # each text attends to its own tokens: no padding, no mask
            if n:
                text = qkv[start : start + n].view(1, n, 3, self.heads, self.head_size)
                q, k, v = text.permute(2, 0, 3, 1, 4)  # each (1, heads, n, head size)
                parts.append(F.scaled_dot_product_attention(q, k, v)[0].transpose(0, 1))
            start += n
        if start < len(h):  # the rows that round the products' shape up
            parts.append(qkv.new_zeros(len(h) - start, self.heads, self.head_size))
        context = (parts[0] if len(parts) == 1 else torch.cat(parts)).reshape(-1, self.hidden)
        h = layer.norm1(layer.out(context).float() + h)
        up = layer.up(h)
        if layer.act is not None:
            up = layer.act(up)
        return layer.norm2(layer.down(up).float() + h)
