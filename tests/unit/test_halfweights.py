"""Products on fp16 copies of the weights (inference/halfweights.py): what they compute,
where they stand aside for the fp32 weights, and the models that use them, on the
packaged all-MiniLM-L6-v2 and a tiny classifier."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from core.config.settings import Settings
from inference import halfweights
from inference.accuracy import load_checked, load_sample
from inference.encoder import Encoder
from inference.seqcls import SequenceClassifier
from tests.tiny_models import make_seqcls_model

pytestmark = [
    pytest.mark.skipif(
        not halfweights.available(), reason="FBGEMM's fp16 products need an x86 CPU with AVX2"
    ),
    pytest.mark.slow,  # each test loads and converts a model for seconds
]


def _layer(inputs: int = 384, outputs: int = 1536) -> torch.nn.Linear:
    torch.manual_seed(0)
    layer = torch.nn.Linear(inputs, outputs)
    with torch.no_grad():
        layer.weight.mul_(3)  # weights of a trained layer's size, not a default init's
    return layer


@pytest.mark.parametrize("rows", [1, 7, 64, halfweights.HALF_ROWS])
def test_a_small_product_reads_the_fp16_copy(rows):
    layer = _layer()
    x = torch.randn(rows, 384)
    packed = halfweights.pack(layer.weight, layer.bias)
    got = halfweights.linear(x, packed, layer.weight, layer.bias)
    want = F.linear(x, layer.weight, layer.bias)
    half = F.linear(x, layer.weight.half().float(), layer.bias)  # fp16 weights, fp32 sums
    assert got.shape == want.shape and got.dtype == torch.float32
    # The fp16 copy's rounding, not fp32's exact product: closer to the rounded weights.
    assert not torch.equal(got, want)
    assert torch.allclose(got, half, atol=1e-4, rtol=1e-4)
    assert (got - want).abs().max() < 2e-3 * want.abs().max()


def test_a_large_product_runs_on_the_fp32_weights():
    layer = _layer()
    x = torch.randn(halfweights.HALF_ROWS + 1, 384)
    packed = halfweights.pack(layer.weight, layer.bias)
    got = halfweights.linear(x, packed, layer.weight, layer.bias)
    assert torch.equal(got, F.linear(x, layer.weight, layer.bias))


def test_leading_dimensions_are_kept_and_counted_as_rows():
    layer = _layer(32, 8)
    module = halfweights.HalfWeightLinear(layer)
    x = torch.randn(3, 5, 32)  # (batch, tokens, hidden): 15 rows
    got = module(x)
    assert got.shape == (3, 5, 8)
    half = F.linear(x, layer.weight.half().float(), layer.bias)
    assert torch.allclose(got, half, atol=1e-4, rtol=1e-4)
    # No rows at all: an empty answer of the right shape, not an error.
    assert module(torch.randn(0, 4, 32)).shape == (0, 4, 8)


def test_convert_replaces_every_plain_linear_and_keeps_the_weights():
    model = torch.nn.Sequential(_layer(16, 16), torch.nn.ReLU(), torch.nn.Sequential(_layer(16, 4)))
    weight = model[2][0].weight
    halfweights.convert(model)
    kinds = [type(m) for m in model.modules()]
    assert torch.nn.Linear not in kinds and kinds.count(halfweights.HalfWeightLinear) == 2
    assert model[2][0].weight is weight  # the fp32 weights stay, for large products
    x = torch.randn(4, 16)
    assert model(x).shape == (4, 4)


@pytest.fixture(scope="module")
def encoders():
    torch.set_num_threads(1)
    return Encoder(precision="fp32"), Encoder(precision="fp16")


def test_an_fp16_encoder_packs_half_copies_and_stays_next_to_fp32(encoders):
    fp32, fp16 = encoders
    assert fp16.half_weights and not fp16.mixed and fp16.packed is not None
    layer = fp16.packed.layers[0]
    assert all(p.half is not None for p in (layer.qkv, layer.out, layer.up, layer.down))
    assert all(
        isinstance(m, halfweights.HalfWeightLinear)
        for m in fp16.model.modules()
        if "Linear" in type(m).__name__
    )
    assert fp16.runtime.endswith(" fp16 cpu")
    texts = load_sample().texts
    for batch_size in (1, 4, 32):  # small products on the fp16 copy; a batch of 32 on both
        cos = F.cosine_similarity(fp32.encode(texts, batch_size), fp16.encode(texts, batch_size))
        assert cos.min().item() > 0.99999


def test_fp16_weights_pass_the_precision_check(encoders, caplog):
    caplog.set_level(logging.INFO, logger="inference.accuracy")
    model = load_checked(
        lambda p: Encoder(precision=p), "fp16", Settings().score_anchors, name="minilm"
    )
    assert model.precision == "fp16" and model.half_weights
    assert model.fixed_encoder is not None and model.fixed_encoder.precision == "fp32"
    assert "minilm: fp16 passed the precision check" in caplog.text


def test_a_classifier_in_fp16_weights_keeps_its_outputs_close_to_fp32(tmp_path):
    path = str(make_seqcls_model(tmp_path / "sentiment", ["negative", "neutral", "positive"]))
    fp32 = SequenceClassifier(path)
    fp16 = SequenceClassifier(path, precision="fp16")
    assert any(isinstance(m, halfweights.HalfWeightLinear) for m in fp16.model.modules())
    texts = load_sample().texts[:20]
    got = fp16.predict(texts)
    assert got.dtype == torch.float32
    assert (fp32.predict(texts) - got).abs().max().item() < 0.01
