"""The three-stage pipeline alone: packaged MiniLM and tiny fine-tuned models, no Celery."""

from __future__ import annotations

import json
import math

import pytest
import torch

from core.util.jsoncodec import dumps
from inference.encoder import Encoder
from inference.ner import TokenClassifier
from inference.pipeline import Pipeline, merge_entities
from inference.seqcls import SequenceClassifier
from tests.tiny_models import make_seqcls_model, make_token_model

TEXTS = [
    "Please refund $49.99 to jane.doe@example.com, the order never arrived.",
    "I absolutely love this app, wonderful service, thank you so much!",
    "This is terrible.\x07 I am furious and want my money back by 2024-06-11.",
]
LABELS = ["billing", "shipping", "praise"]


@pytest.fixture(scope="module")
def encoder():
    torch.set_num_threads(1)
    return Encoder(batch_size=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {
        "topic": SequenceClassifier(
            str(make_seqcls_model(root / "topic", ["sports", "food", "tech"], bias=[0, 5, 0]))
        ),
        "sentiment": SequenceClassifier(
            str(make_seqcls_model(root / "sent", ["negative", "positive"], bias=[0, 6]))
        ),
        "ner": TokenClassifier(
            str(
                make_token_model(
                    root / "ner", ["O", "B-PER", "I-PER", "B-ORG", "I-ORG"], bias=[0, 6, 0, 0, 0]
                )
            )
        ),
    }


def test_default_registry_runs_every_task(encoder):
    pipeline = Pipeline(lambda task: None if task == "extract" else encoder)
    outputs, times = pipeline.run(TEXTS, ["classify", "score", "extract", "embed"], LABELS)
    assert len(outputs) == len(TEXTS)
    for out in outputs:
        fields = {"label", "score", "scores", "rating", "entities", "embedding", "tokens"}
        assert set(out) == fields
        assert out["label"] in LABELS and out["score"] == max(out["scores"].values())
        assert -1.0 <= out["rating"] <= 1.0
        assert len(out["embedding"]) == 384
        assert math.isclose(math.sqrt(sum(x * x for x in out["embedding"])), 1.0, abs_tol=1e-4)
    assert times.pre > 0 and times.model > 0 and times.post > 0
    # The anchors put praise above fury.
    assert outputs[1]["rating"] > 0 > outputs[2]["rating"]
    # Pattern entities keep offsets into the text as submitted (control characters and all).
    for text, out in zip(TEXTS, outputs, strict=True):
        for entity in out["entities"]:
            assert text[entity["start"] : entity["end"]] == entity["text"]
    types = {(e["type"], e["text"]) for e in outputs[0]["entities"]}
    assert {("money", "$49.99"), ("email", "jane.doe@example.com")} <= types
    assert ("date", "2024-06-11") in {(e["type"], e["text"]) for e in outputs[2]["entities"]}


def test_tasks_alone_produce_only_their_fields(encoder):
    pipeline = Pipeline(lambda task: encoder)
    outputs, _ = pipeline.run(TEXTS, ["score"])
    assert all(set(out) == {"rating"} for out in outputs)
    outputs, _ = pipeline.run(TEXTS[:1], ["embed"])
    assert set(outputs[0]) == {"embedding", "tokens"}


def test_embed_counts_the_tokens_the_model_read(encoder):
    """`tokens` is what the tokenizer gave the model for each text, in input order whatever
    the length-sorted micro-batches (special tokens in, past max_length cut off)."""
    texts = ["hi", "a much longer text " * 3, "hello world", "word " * 2000]
    outputs, _ = Pipeline(lambda task: encoder).run(texts, ["embed"])
    expected = [len(encoder.tokenizer(t)["input_ids"]) for t in texts[:3]]
    assert [o["tokens"] for o in outputs[:3]] == expected
    assert expected[0] == 3  # [CLS] hi [SEP]
    assert outputs[3]["tokens"] == encoder.max_length


def test_identical_texts_get_identical_outputs(encoder):
    pipeline = Pipeline(lambda task: encoder)
    outputs, _ = pipeline.run([TEXTS[0], TEXTS[1], TEXTS[0]], ["classify", "score"], LABELS)
    assert outputs[0] == outputs[2]


def test_fine_tuned_models_through_the_pipeline(tiny):
    models = {"classify": tiny["topic"], "score": tiny["sentiment"], "extract": tiny["ner"]}
    pipeline = Pipeline(models.__getitem__)
    texts = ["john smith visited acme corp in london", "the food was great", "mail a@b.co"]
    outputs, times = pipeline.run(texts, ["classify", "score", "extract"])
    for text, out in zip(texts, outputs, strict=True):
        assert out["label"] == "food"  # the tiny model's bias makes "food" win
        assert set(out["scores"]) == {"sports", "food", "tech"}
        assert out["rating"] > 0.9  # biased towards "positive"
        for entity in out["entities"]:
            assert text[entity["start"] : entity["end"]] == entity["text"]
            assert entity["type"] in {"PER", "ORG", "email", "url", "phone", "money", "date"}
    # The tiny NER model is biased to B-PER: every word is a person, and wins any overlap
    # with a pattern entity.
    first = outputs[0]["entities"]
    assert first and all(e["type"] == "PER" and e["source"] == "model" for e in first)
    assert [e["text"] for e in first] == texts[0].split()
    assert times.model > 0


def test_pattern_entities_never_overlap_model_entities():
    model = [{"type": "ORG", "text": "x", "start": 5, "end": 10, "source": "model"}]
    patterns = [
        {"type": "url", "text": "y", "start": 8, "end": 20, "source": "pattern"},
        {"type": "email", "text": "z", "start": 0, "end": 5, "source": "pattern"},
    ]
    merged = merge_entities(model, patterns)
    assert [(e["start"], e["end"]) for e in merged] == [(0, 5), (5, 10)]


def as_json(outputs: list[dict]) -> list[dict]:
    """Outputs as a client reads them (an embedding's vector is a numpy array inside)."""
    return json.loads(dumps(outputs))


def test_stages_resume_in_other_processes_through_bytes(encoder, tiny):
    """The split design: pre in one process, model in another, post in a third."""
    from inference.pipeline import Staged

    models = {"classify": encoder, "score": tiny["sentiment"], "extract": tiny["ner"]}
    tasks = ["classify", "score", "extract", "embed"]
    models["embed"] = encoder
    whole, _ = Pipeline(models.__getitem__).run(TEXTS, tasks, LABELS)

    pre = Pipeline(models.__getitem__).pre(TEXTS, tasks)
    on_device = Staged(tasks)
    on_device.load("prepared", pre.to_bytes("prepared"))
    Pipeline(models.__getitem__).model(on_device, LABELS)
    after = Staged(tasks)
    after.load("prepared", pre.to_bytes("prepared"))
    after.load("raw", on_device.to_bytes("raw"))
    split = Pipeline(models.__getitem__).post(after, TEXTS, LABELS)
    assert as_json(split) == as_json(whole)
