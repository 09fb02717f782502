"""Sequence and token classifiers on tiny random BERT models built here (nothing downloaded).

Random weights say nothing about quality: these tests check shapes, ordering, label handling,
the rating rules, and the BIO aggregation (with hand-made probabilities).
"""

from types import SimpleNamespace

import pytest
import torch

from inference.batching import prepare
from inference.ner import TokenClassifier, aggregate, split_tag
from inference.seqcls import SequenceClassifier, config_labels, rating_weights
from tests.tiny_models import make_seqcls_model, make_token_model

SENTIMENT = ["NEGATIVE", "NEUTRAL", "POSITIVE"]
STARS = ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"]
NER = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
TEXTS = [
    "the food was great",
    "terrible service , very slow delivery !",
    "i loved it",
    "john smith works at acme corp in london .",
    "awful",
    "mary jones visited paris and new york with johnson from google",
    "the staff was not so good but the price was fast",
]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-models")
    return {
        "sentiment": make_seqcls_model(root / "sentiment", SENTIMENT),
        "positive": make_seqcls_model(root / "positive", SENTIMENT, bias=[-8.0, 0.0, 8.0]),
        "negative": make_seqcls_model(root / "negative", SENTIMENT, bias=[8.0, 0.0, -8.0]),
        "stars": make_seqcls_model(root / "stars", STARS),
        "five_stars": make_seqcls_model(root / "five", STARS, bias=[-8.0, -8.0, -8.0, 0.0, 8.0]),
        "topics": make_seqcls_model(root / "topics", ["sports", "politics", "tech"]),
        "pair": make_seqcls_model(root / "pair", ["LABEL_0", "LABEL_1"], bias=[-8.0, 8.0]),
        "ner": make_token_model(root / "ner", NER),
    }


@pytest.fixture(scope="module")
def sentiment(model_dirs):
    torch.set_num_threads(1)
    return SequenceClassifier(str(model_dirs["sentiment"]), batch_size=2)


@pytest.fixture(scope="module")
def tagger(model_dirs):
    return TokenClassifier(str(model_dirs["ner"]), batch_size=2)


# --- sequence classification -------------------------------------------------------------


def test_probabilities_sum_to_one_in_input_order(sentiment):
    probs = sentiment.forward(sentiment.prepare(TEXTS))
    assert probs.shape == (len(TEXTS), 3)
    assert probs.dtype == torch.float32
    assert torch.allclose(probs.sum(dim=1), torch.ones(len(TEXTS)), atol=1e-5)
    # Length-sorted micro-batches (batch_size=2) must not reorder the rows.
    alone = torch.cat([sentiment.forward(sentiment.prepare([t])) for t in TEXTS])
    assert torch.allclose(probs, alone, atol=1e-5)
    # The random model still tells texts apart, so the order check above means something.
    assert not torch.allclose(probs[0], probs[1], atol=1e-4)


def test_empty_input(sentiment):
    assert sentiment.forward(sentiment.prepare([])).shape == (0, 3)
    assert sentiment.classify_outputs(torch.empty((0, 3))) == []
    assert sentiment.rating_outputs(torch.empty((0, 3))) == []


def test_labels_come_from_id2label(sentiment, model_dirs):
    assert sentiment.labels == SENTIMENT
    assert SequenceClassifier(str(model_dirs["stars"])).labels == STARS


def test_given_labels_override_and_must_match_num_labels(model_dirs):
    path = str(model_dirs["sentiment"])
    assert SequenceClassifier(path, labels=["neg", "mid", "pos"]).labels == ["neg", "mid", "pos"]
    with pytest.raises(ValueError, match="num_labels=3"):
        SequenceClassifier(path, labels=["neg", "pos"])


def test_config_labels_rejects_a_short_id2label():
    config = SimpleNamespace(num_labels=3, id2label={0: "a", 1: "b"})
    with pytest.raises(ValueError, match="id2label"):
        config_labels(config)
    assert config_labels(SimpleNamespace(num_labels=2, id2label={"1": "b", "0": "a"})) == ["a", "b"]


def test_classify_outputs(sentiment):
    probs = sentiment.forward(sentiment.prepare(TEXTS[:3]))
    results = sentiment.classify_outputs(probs)
    assert len(results) == 3
    for row, result in zip(probs.tolist(), results, strict=True):
        assert list(result["scores"]) == SENTIMENT
        assert result["label"] == SENTIMENT[max(range(3), key=row.__getitem__)]
        assert result["score"] == max(result["scores"].values())
        assert result["scores"] == {k: round(p, 6) for k, p in zip(SENTIMENT, row, strict=True)}


def test_rating_is_bounded(sentiment):
    ratings = sentiment.rating_outputs(sentiment.forward(sentiment.prepare(TEXTS)))
    assert len(ratings) == len(TEXTS)
    assert all(-1.0 <= r <= 1.0 for r in ratings)


@pytest.mark.parametrize(
    "name, check",
    [
        ("positive", lambda r: r > 0.9),
        ("negative", lambda r: r < -0.9),
        ("five_stars", lambda r: r > 0.9),
        ("pair", lambda r: r > 0.9),
    ],
)
def test_rating_sign_follows_the_dominant_label(model_dirs, name, check):
    model = SequenceClassifier(str(model_dirs[name]))
    ratings = model.rating_outputs(model.forward(model.prepare(TEXTS[:3])))
    assert all(check(r) for r in ratings), ratings


def test_rating_from_stars_is_the_expected_star_mapped_linearly(model_dirs):
    model = SequenceClassifier(str(model_dirs["stars"]))
    uniform = torch.full((1, 5), 0.2)
    three = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0]])
    split = torch.tensor([[0.5, 0.0, 0.0, 0.0, 0.5]])
    four = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0]])
    assert model.rating_outputs(torch.cat([uniform, three, split, four])) == [0.0, 0.0, 0.0, 0.5]


def test_unusable_labels_raise_on_rating_not_on_classify(model_dirs):
    model = SequenceClassifier(str(model_dirs["topics"]))
    probs = model.forward(model.prepare(TEXTS[:2]))
    assert len(model.classify_outputs(probs)) == 2
    with pytest.raises(ValueError, match="cannot be turned into a rating"):
        model.rating_outputs(probs)


@pytest.mark.parametrize(
    "labels, weights",
    [
        (["negative", "positive"], [-1.0, 1.0]),
        (["positive", "negative"], [1.0, -1.0]),
        (["NEG", "NEU", "POS"], [-1.0, 0.0, 1.0]),
        (["1 star", "2 stars", "3 stars", "4 stars", "5 stars"], [-1.0, -0.5, 0.0, 0.5, 1.0]),
        (["1", "2", "3", "4", "5"], [-1.0, -0.5, 0.0, 0.5, 1.0]),
        (["5 stars", "1 star", "3 stars"], [1.0, -1.0, 0.0]),
        (["LABEL_0", "LABEL_1"], [-1.0, 1.0]),
        (["spam", "ham"], [-1.0, 1.0]),
    ],
)
def test_rating_weights(labels, weights):
    assert rating_weights(labels) == pytest.approx(weights)


@pytest.mark.parametrize(
    "labels",
    [["LABEL_0", "LABEL_1", "LABEL_2"], ["sports", "politics", "tech"], ["1", "1", "2"], ["x"]],
)
def test_rating_weights_reject_unusable_labels(labels):
    with pytest.raises(ValueError, match="cannot be turned into a rating"):
        rating_weights(labels)


# --- BIO aggregation, with hand-made tags ---------------------------------------------------


def tags_to_ids(tags: list[str]) -> list[int]:
    return [NER.index(t) for t in tags]


def test_split_tag():
    assert split_tag("B-PER") == ("B", "PER")
    assert split_tag("I-ORG") == ("I", "ORG")
    assert split_tag("O") == (None, None)
    assert split_tag("PER") == (None, "PER")


def test_aggregate_merges_word_pieces_and_skips_special_tokens():
    text = "Johnson Smith met Acme"
    # [CLS] john ##son smith met acme [SEP] [PAD]
    offsets = [(0, 0), (0, 4), (4, 7), (8, 13), (14, 17), (18, 22), (0, 0), (0, 0)]
    tags = ["O", "B-PER", "B-PER", "I-PER", "O", "B-ORG", "O", "O"]
    scores = [0.99, 0.9, 0.8, 0.7, 0.99, 0.6, 0.99, 0.99]
    entities = aggregate(offsets, tags_to_ids(tags), scores, NER, text)
    assert entities == [
        {
            "type": "PER",
            "text": "Johnson Smith",
            "start": 0,
            "end": 13,
            "score": 0.8,
            "source": "model",
        },
        {"type": "ORG", "text": "Acme", "start": 18, "end": 22, "score": 0.6, "source": "model"},
    ]


def test_aggregate_b_after_b_of_a_separate_word_starts_a_new_entity():
    text = "John Mary"
    offsets = [(0, 0), (0, 4), (5, 9), (0, 0)]
    entities = aggregate(offsets, tags_to_ids(["O", "B-PER", "B-PER", "O"]), [1.0] * 4, NER, text)
    assert [e["text"] for e in entities] == ["John", "Mary"]


def test_aggregate_i_after_o_or_another_type_starts_a_new_entity():
    text = "met Paris New York"
    offsets = [(0, 0), (0, 3), (4, 9), (10, 13), (14, 18), (0, 0)]
    tags = ["O", "O", "I-LOC", "I-ORG", "I-ORG", "O"]
    entities = aggregate(offsets, tags_to_ids(tags), [0.5] * 6, NER, text)
    assert [(e["type"], e["text"], e["start"], e["end"]) for e in entities] == [
        ("LOC", "Paris", 4, 9),
        ("ORG", "New York", 10, 18),
    ]


def test_aggregate_a_special_token_ends_an_entity():
    text = "Acme"
    offsets = [(0, 0), (0, 4), (0, 0)]
    entities = aggregate(offsets, tags_to_ids(["O", "B-ORG", "I-ORG"]), [1.0] * 3, NER, text)
    assert [(e["text"], e["end"]) for e in entities] == [("Acme", 4)]


def test_aggregate_bare_labels_extend_entities_of_the_same_type():
    labels = ["O", "PER", "LOC"]
    text = "Mary Jones in Paris"
    offsets = [(0, 0), (0, 4), (5, 10), (11, 13), (14, 19), (0, 0)]
    entities = aggregate(offsets, [0, 1, 1, 0, 2, 0], [0.5, 0.4, 0.6, 0.5, 0.9, 0.5], labels, text)
    assert [(e["type"], e["text"], e["score"]) for e in entities] == [
        ("PER", "Mary Jones", 0.5),
        ("LOC", "Paris", 0.9),
    ]


def test_aggregate_keeps_a_leading_space_out_of_the_span():
    # Byte-level BPE tokenizers may count the space before a word into its span.
    text = "hi Paris"
    offsets = [(0, 0), (0, 2), (2, 8), (0, 0)]
    entities = aggregate(offsets, tags_to_ids(["O", "O", "B-LOC", "O"]), [1.0] * 4, NER, text)
    assert [(e["text"], e["start"], e["end"]) for e in entities] == [("Paris", 3, 8)]


# --- token classification end to end --------------------------------------------------------


def test_token_classifier_end_to_end(tagger):
    assert tagger.labels == NER
    prepared = tagger.prepare(TEXTS)
    per_batch = tagger.forward(prepared)
    assert len(per_batch) == len(prepared.batches) == 4
    for (_, enc), probs in zip(prepared.batches, per_batch, strict=True):
        assert probs.shape == (*enc["input_ids"].shape, len(NER))
        assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[:2]), atol=1e-5)
    results = tagger.entities(prepared, per_batch, TEXTS)
    assert len(results) == len(TEXTS)
    types = {split_tag(label)[1] for label in NER} - {None}
    assert any(results)
    for text, entities in zip(TEXTS, results, strict=True):
        assert [e["start"] for e in entities] == sorted(e["start"] for e in entities)
        for e in entities:
            assert e["text"] == text[e["start"] : e["end"]] != ""
            assert e["type"] in types
            assert 0.0 < e["score"] <= 1.0
            assert e["source"] == "model"
    # Batching must not change which text gets which entities.
    assert results == [tagger.extract([t])[0] for t in TEXTS]


def test_token_classifier_mixed_case_offsets(tagger):
    text = "John SMITH works at ACME Corp in London."
    (entities,) = tagger.extract([text])
    for e in entities:
        assert e["text"] == text[e["start"] : e["end"]]


def test_token_classifier_empty_input_and_empty_text(tagger):
    assert tagger.extract([]) == []
    assert tagger.extract(["", "mary"])[0] == []


def test_entities_need_offsets(tagger):
    prepared = prepare(tagger.tokenizer, ["john smith"], 32, 2)
    with pytest.raises(ValueError, match="offsets"):
        tagger.entities(prepared, tagger.forward(prepared), ["john smith"])
