"""The model stage alone: the packaged MiniLM, no Celery, no Flask."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.encoder import Encoder
from inference.pipeline import Pipeline
from inference.text import clean


@pytest.fixture(scope="module")
def encoder():
    torch.set_num_threads(1)
    return Encoder(batch_size=4)


def test_embeddings_are_normalized_and_order_preserving(encoder):
    texts = ["short", "a much longer sentence about shipping delays and refunds", "mid length"]
    vectors = encoder.encode(texts)
    assert vectors.shape == (3, 384)
    assert torch.allclose(vectors.norm(dim=1), torch.ones(3), atol=1e-5)
    # Length-sorted batching must not reorder the outputs.
    one_by_one = torch.cat([encoder.encode([t]) for t in texts])
    assert torch.allclose(vectors, one_by_one, atol=1e-5)


def test_zero_shot_picks_the_obvious_label(encoder):
    labels = ["football match", "cooking recipe", "computer programming"]
    results, _ = Pipeline(lambda task: encoder).run(
        [
            "The striker scored twice in the second half and the home team won the cup.",
            "Whisk two eggs with flour and sugar, then bake for twenty minutes.",
            "The Python function raised a TypeError because the argument was None.",
        ],
        ["classify"],
        labels,
    )
    assert [r["label"] for r in results] == labels
    for r in results:
        assert set(r["scores"]) == set(labels)
        assert r["score"] == max(r["scores"].values())


def test_clean_normalizes_unicode_and_whitespace():
    assert clean("cafe\u0301\t\x00 ok\n\nthere ") == "caf\u00e9 ok there"


def test_a_stop_check_interrupts_the_model_stage_between_micro_batches():
    import torch

    from inference.batching import Prepared, run_batches
    from inference.stages import Interrupted, interruptible

    prepared = Prepared(n=3, batches=[([i], {"x": torch.tensor([[float(i)]])}) for i in range(3)])
    seen = []

    def forward(inputs):
        seen.append(int(inputs["x"].item()))
        return inputs["x"]

    asked = iter([False, False, True])
    with interruptible(lambda: next(asked)), pytest.raises(Interrupted):
        run_batches(prepared, forward, torch.device("cpu"))
    assert seen == [0, 1]  # the third batch never ran
    assert len(run_batches(prepared, forward, torch.device("cpu"))) == 3  # no check outside


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(max_codepoint=127), max_size=80))
def test_clean_makes_every_ascii_control_character_a_space(text):
    spaced = "".join(" " if ord(ch) < 32 or ord(ch) == 127 else ch for ch in text)
    assert clean(text) == " ".join(spaced.split())
    assert clean(text).isprintable()
