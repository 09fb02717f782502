"""The pure parts of POST /v1/embeddings: what `input` may be, the model's names and size,
and base64 vectors exactly as the OpenAI SDK decodes them."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from core.config.settings import ModelSpec, Settings
from webapp.openai_compat import (
    FieldError,
    check_dimensions,
    encode,
    input_limit,
    model_dimension,
    model_names,
    parse_input,
    parse_request,
)


def test_base64_is_little_endian_float32_as_the_sdk_decodes_it():
    vector = [0.25, -1.5, 3.0e-7, 1.0]
    encoded = encode(vector, "base64")
    # What openai-python does with a base64 embedding.
    decoded = np.frombuffer(base64.b64decode(encoded), dtype="float32").tolist()
    assert decoded == pytest.approx(vector, rel=1e-7)
    assert encode(vector, "float") is vector


def test_input_a_string_or_a_list_of_strings():
    assert parse_input("hello", 4, "X", 100) == ["hello"]
    assert parse_input(["a", "b"], 4, "X", 100) == ["a", "b"]


@pytest.mark.parametrize(
    "raw,needle",
    [
        ([], "empty list"),
        ({"text": "a"}, "a string or a list of strings"),
        (None, "a string or a list of strings"),
        ([1, 2, 3], "token ids"),
        ([[1, 2], [3]], "token ids"),
        (["a", None], "input[1] must be a string"),
        (["a", True], "input[1] must be a string"),
        (["a", ""], "input[1]: the text is empty"),
        ("   ", "input[0]: the text is empty"),
        (["x" * 101], "LANEWAY_MAX_TEXT_CHARS"),
        (["a"] * 5, "at most 4 (LANEWAY_EMBEDDINGS_MAX_INPUTS)"),
        (["ok", "bad \ud800"], "input[1]"),
    ],
)
def test_bad_input_is_refused_naming_the_problem(raw, needle):
    with pytest.raises(FieldError) as err:
        parse_input(raw, 4, "LANEWAY_EMBEDDINGS_MAX_INPUTS", 100)
    assert needle in str(err.value) and err.value.param == "input"


def test_the_limit_is_the_smaller_of_the_setting_and_the_account_types():
    settings = Settings.from_env({"LANEWAY_EMBEDDINGS_MAX_INPUTS": "100"})
    assert input_limit(settings, "standard") == (100, "LANEWAY_EMBEDDINGS_MAX_INPUTS")
    small = Settings.from_env(
        {"LANEWAY_EMBEDDINGS_MAX_INPUTS": "100", "LANEWAY_MAX_ITEMS_DEMO": "10"}
    )
    assert input_limit(small, "demo") == (10, "LANEWAY_MAX_ITEMS_DEMO")


def test_model_names_and_dimension_of_the_packaged_default():
    default = ModelSpec("minilm", "embedding")
    assert model_names(default) == [
        "minilm", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"
    ]  # fmt: skip
    assert model_names(ModelSpec("mine", "embedding", "/models/e5-small")) == ["mine", "e5-small"]
    # The operator's served names come after the registry name, each once.
    served = ("embeddings", "minilm", "all-MiniLM-L6-v2")
    assert model_names(default, served) == [
        "minilm", "embeddings", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"
    ]  # fmt: skip
    assert model_dimension("") == 384
    assert model_dimension("/no/such/folder") is None
    check_dimensions(default, 384, 384)
    with pytest.raises(FieldError, match="384-dimensional .* cannot shorten them"):
        check_dimensions(default, 256, 384)
    check_dimensions(default, 256, None)  # unknown here: checked on the answer instead


@pytest.mark.parametrize(
    "body,param,status",
    [
        (b'{"input": "a"}', "model", 400),
        (b'{"model": "minilm"}', "input", 400),
        (b'{"input": "a", "model": "gpt-4"}', "model", 404),
        (b'{"input": "a", "model": 3}', "model", 400),
        (b'{"input": "a", "model": "minilm", "encoding_format": "int8"}', "encoding_format", 400),
        (b'{"input": "a", "model": "minilm", "dimensions": 128}', "dimensions", 400),
        (b'{"input": "a", "model": "minilm", "dimensions": "384"}', "dimensions", 400),
        (b'{"input": "a", "model": "minilm", "dimensions": true}', "dimensions", 400),
        (b'{"input": "a", "model": "minilm", "user": 5}', "user", 400),
    ],
)
def test_bad_fields_name_their_param(body, param, status):
    with pytest.raises(FieldError) as err:
        parse_request(Settings.from_env({}), body, "standard")
    assert (err.value.param, err.value.status) == (param, status)


def test_a_good_request():
    body = b'{"input": ["a", "b"], "model": "all-MiniLM-L6-v2", "dimensions": 384, "user": "u"}'
    asked = parse_request(Settings.from_env({}), body, "standard")
    assert (asked.texts, asked.model.name, asked.encoding) == (["a", "b"], "minilm", "float")
    with pytest.raises(ValueError, match="unknown field 'temperature'"):
        parse_request(
            Settings.from_env({}), b'{"input": "a", "model": "minilm", "temperature": 1}', "s"
        )
