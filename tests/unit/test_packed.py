"""The packed BERT forward (inference/packed.py) against transformers' own, on the
packaged all-MiniLM-L6-v2: the same vectors, or transformers' forward kept."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
import torch.nn.functional as F

from inference import precision as prec
from inference.encoder import Encoder
from inference.packed import PackedBert

pytestmark = pytest.mark.slow  # loads the model and runs both forwards for seconds

TEXTS = [
    "",
    "ok",
    "My card was charged twice for the same order and support has not answered.",
    "The parcel arrived damaged, the box was crushed and two of the glasses inside are "
    "broken; I would like a replacement or a refund, whichever is quicker for you.",
    "login fails",
    "word " * 400,  # truncated at the encoder's max length
    "Rechnung doppelt bezahlt – bitte erstatten. 请退款 🙂",
]


@pytest.fixture(scope="module")
def fp32_pair():
    torch.set_num_threads(1)
    return Encoder(precision="fp32", packed=False), Encoder(precision="fp32")


def test_fp32_packed_gives_transformers_vectors_in_any_batch(fp32_pair):
    eager, packed = fp32_pair
    assert eager.packed is None and packed.packed is not None
    want = eager.encode(TEXTS)
    for batch_size in (1, 3, 32):  # alone, padded in small batches, all in one
        got = packed.encode(TEXTS, batch_size=batch_size)
        assert got.shape == want.shape
        assert F.cosine_similarity(want, got, dim=1).min().item() > 0.999999
        assert (want - got).abs().max().item() < 1e-5


@pytest.mark.skipif(not prec.native_bf16_cpu(), reason="this CPU has no native bf16")
def test_bf16_packed_stays_as_close_to_fp32_as_transformers_bf16(fp32_pair):
    eager32, _ = fp32_pair
    eager16, packed16 = Encoder(precision="bf16", packed=False), Encoder(precision="bf16")
    assert packed16.packed is not None
    assert packed16.packed.layers[0].up.prepacked == prec.native_bf16_cpu()
    want = eager32.encode(TEXTS)
    plain = F.cosine_similarity(want, eager16.encode(TEXTS), dim=1).min().item()
    got = F.cosine_similarity(want, packed16.encode(TEXTS), dim=1).min().item()
    assert got > 0.9999 and got >= plain - 1e-5


def test_batches_side_by_side_on_threads_get_their_own_vectors(fp32_pair):
    _, packed = fp32_pair
    batches = [TEXTS[:4], TEXTS[3:], TEXTS[::2]]
    alone = [packed.encode(b) for b in batches]
    got: dict[int, torch.Tensor] = {}

    def run(n: int) -> None:
        for _ in range(3):
            got[n] = packed.encode(batches[n])

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n, want in enumerate(alone):
        assert torch.allclose(got[n], want, atol=1e-6)


def test_other_architectures_and_devices_keep_transformers_forward(fp32_pair):
    from transformers import RobertaConfig, RobertaModel

    eager, _ = fp32_pair
    tiny = RobertaModel(
        RobertaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, vocab_size=100)
    )  # fmt: skip
    assert "roberta" in PackedBert.supports(tiny, torch.device("cpu"))
    assert PackedBert.build(tiny, torch.device("cpu"), False) is None
    assert PackedBert.supports(eager.model, torch.device("cuda")) != ""
    assert PackedBert.supports(eager.model, torch.device("cpu")) == ""


def test_a_packed_forward_that_disagrees_is_not_used(fp32_pair, monkeypatch, caplog):
    eager, _ = fp32_pair
    caplog.set_level(logging.WARNING, logger="inference.packed")
    # Heads in the wrong order: plausible-looking vectors, the wrong ones.
    real_init = PackedBert.__init__

    def swapped_heads(self, model, prepack, half=False):
        real_init(self, model, prepack, half)
        self.layers[0].qkv.weight = self.layers[0].qkv.weight.roll(32, dims=0)

    monkeypatch.setattr(PackedBert, "__init__", swapped_heads)
    assert PackedBert.build(eager.model, torch.device("cpu"), False) is None
    assert "agreed to cosine" in caplog.text
    # One that raises (another transformers release, say) is not used either.
    monkeypatch.setattr(PackedBert, "mean_pooled", lambda self, inputs: 1 / 0)
    assert PackedBert.build(eager.model, torch.device("cpu"), False) is None
    assert "the packed one failed (division by zero)" in caplog.text


def test_token_rows_round_up_to_few_shapes_and_little_waste():
    from inference.packed import padded_rows

    rows = [padded_rows(n) for n in range(1, 20001)]
    assert all(n <= r <= n + max(0, n // 8) for n, r in zip(range(1, 20001), rows, strict=True))
    assert rows[:15] == list(range(1, 16))  # a lone short text runs as it is
    assert rows == sorted(rows)
    assert len(set(rows)) < 130  # a shape per step, eight steps per power of two


def transformers_pooled(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.inference_mode():
        hidden = model(**inputs).last_hidden_state.float()
    weights = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)


@pytest.mark.parametrize("without_layers", [False, True])
def test_embeddings_of_pairs_padding_and_missing_type_ids_match_transformers(
    fp32_pair, without_layers
):
    """PackedBert embeds the real tokens alone (a type's and a position's rows summed once
    for single texts): text pairs (second-segment type ids), left and right padding, and
    inputs without type ids must still give transformers' vectors; so must a BERT without
    layers (the control-plane benchmark's near-free model)."""
    from transformers import BertModel

    eager, _ = fp32_pair
    model = eager.model
    if without_layers:
        config = model.config.__class__.from_dict(
            {**model.config.to_dict(), "num_hidden_layers": 0}
        )
        model = BertModel(config).eval()
        torch.manual_seed(1)
        with torch.no_grad():  # type rows far apart, so that a wrong type's row shows
            model.embeddings.token_type_embeddings.weight.normal_(0, 1)
    packed = PackedBert.build(model, torch.device("cpu"), False)
    assert packed is not None and len(packed.layers) == (0 if without_layers else 6)
    pairs = eager.tokenizer(
        ["login fails", "My card was charged twice for the same order.", "ok"],
        ["since yesterday", "Refund please", "a second segment much longer than its first"],
        padding=True,
        return_tensors="pt",
    )
    assert pairs["token_type_ids"].any()
    inputs = [dict(pairs), {k: v for k, v in pairs.items() if k != "token_type_ids"}]
    left = eager.tokenizer(TEXTS[1:5], padding=True, return_tensors="pt")
    width = left["input_ids"].shape[1]
    lengths = left["attention_mask"].sum(1)
    inputs.append(
        {  # each row's tokens moved to its end: padding on the left
            name: torch.stack([row.roll(int(width - n)) for row, n in zip(v, lengths, strict=True)])
            for name, v in left.items()
        }
    )
    for batch in inputs:
        want = transformers_pooled(model, batch)
        with torch.inference_mode():
            got = packed.mean_pooled(batch)
        assert (want - got).abs().max().item() < 1e-5
