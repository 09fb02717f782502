"""LangChain's `OpenAIEmbeddings` and LlamaIndex's `OpenAIEmbedding` and
`OpenAILikeEmbedding`, as installed, against `laneway web` (gunicorn) and a real interactive
worker (the fleet of test_openai_sdk.py): each embeds documents and a query, sync and async,
and gets the model's own vectors, compared with the model run in this process. LangChain's
default call, which sends token ids, gets the 400 that names the setting that fixes it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import numpy as np
import openai
import pytest
import tiktoken

from tests.e2e import test_openai_sdk

if TYPE_CHECKING:
    from langchain_openai import OpenAIEmbeddings

pytestmark = pytest.mark.e2e
# test_openai_sdk.py's fleet (web app, interactive and cpu workers, its settings) and keys.
server, key = test_openai_sdk.server, test_openai_sdk.key
DOCUMENTS = [
    "I was charged twice for the same order",
    "my parcel never arrived and nobody answers my emails",
    "thanks, the replacement works perfectly",
]
QUERY = "where is my package?"


@pytest.fixture(scope="module")
def minilm():
    """The model in this process, fp32: what each framework's vectors must equal."""
    from inference.encoder import Encoder

    encoder = Encoder(precision="fp32", packed=False)
    return lambda texts: encoder.encode(texts).numpy()


def assert_minilms(got, want) -> None:
    """The same vectors: 384 values each, cosine ~1 (the worker may run bf16 batches)."""
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape == (len(want), 384)
    cosine = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.999, cosine


def langchain(url: str, api_key: str, **options) -> OpenAIEmbeddings:
    # The frameworks are imported by the tests that use them, not at collection: every
    # xdist worker collects this file, and LangChain and LlamaIndex take seconds to import.
    from langchain_openai import OpenAIEmbeddings

    return OpenAIEmbeddings(
        model="minilm", base_url=f"{url}/v1", api_key=api_key, max_retries=0, **options
    )


def test_langchain_with_check_embedding_ctx_length_off(server, key, minilm):
    embeddings = langchain(server, key, check_embedding_ctx_length=False)
    assert_minilms(embeddings.embed_documents(DOCUMENTS), minilm(DOCUMENTS))
    assert_minilms([embeddings.embed_query(QUERY)], minilm([QUERY]))

    async def both():
        return await asyncio.gather(
            embeddings.aembed_documents(DOCUMENTS), embeddings.aembed_query(QUERY)
        )

    documents, query = asyncio.run(both())
    assert_minilms(documents, minilm(DOCUMENTS))
    assert_minilms([query], minilm([QUERY]))


@pytest.fixture
def offline_cl100k(monkeypatch):
    """tiktoken downloads cl100k_base's ranks on first use and this machine has no way out:
    a byte-level encoding stands in under that name. LangChain's default path runs as
    shipped and sends token ids, which is all Laneway's answer depends on."""
    ranks = {bytes([b]): b for b in range(256)}
    stand_in = tiktoken.Encoding("cl100k_base", pat_str=r"\S+|\s+", mergeable_ranks=ranks,
                                 special_tokens={})  # fmt: skip
    monkeypatch.setitem(tiktoken.registry.ENCODINGS, "cl100k_base", stand_in)


def test_langchains_default_gets_a_400_naming_the_setting(server, key, offline_cl100k):
    embeddings = langchain(server, key)
    assert embeddings.check_embedding_ctx_length  # LangChain's default
    for call, text in ((embeddings.embed_documents, DOCUMENTS), (embeddings.embed_query, QUERY)):
        with pytest.raises(openai.BadRequestError) as err:
            call(text)
        assert err.value.status_code == 400
        assert err.value.body["param"] == "input" and err.value.body["code"] == "invalid_input"
        message = err.value.body["message"]
        assert "token ids" in message and "check_embedding_ctx_length=False" in message


def test_llamaindex_openai_like_embedding(server, key, minilm):
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    embeddings = OpenAILikeEmbedding(
        model_name="minilm", api_base=f"{server}/v1", api_key=key, max_retries=0
    )
    assert_minilms(embeddings.get_text_embedding_batch(DOCUMENTS), minilm(DOCUMENTS))
    assert_minilms([embeddings.get_query_embedding(QUERY)], minilm([QUERY]))
    query = asyncio.run(embeddings.aget_query_embedding(QUERY))
    assert_minilms([query], minilm([QUERY]))


def test_llamaindex_openai_embedding_by_model_name(server, key, minilm):
    """`OpenAIEmbedding` checks `model` against OpenAI's names before it sends anything;
    `model_name` is what it then sends, and passes by Laneway's own name."""
    from llama_index.embeddings.openai import OpenAIEmbedding

    with pytest.raises(ValueError, match="minilm"):
        OpenAIEmbedding(model="minilm", api_base=f"{server}/v1", api_key=key)
    embeddings = OpenAIEmbedding(
        model_name="minilm", api_base=f"{server}/v1", api_key=key, max_retries=0
    )
    assert_minilms(embeddings.get_text_embedding_batch(DOCUMENTS), minilm(DOCUMENTS))
    assert_minilms([embeddings.get_query_embedding(QUERY)], minilm([QUERY]))
    documents = asyncio.run(embeddings.aget_text_embedding_batch(DOCUMENTS))
    assert_minilms(documents, minilm(DOCUMENTS))


def test_llamaindex_openai_embedding_by_a_served_openai_name(server, key, minilm):
    """With LANEWAY_SERVED_MODEL_NAMES holding an OpenAI name, the class's check passes
    unchanged; the vectors stay the model's 384, and asking for OpenAI's size is a 400."""
    from llama_index.embeddings.openai import OpenAIEmbedding

    embeddings = OpenAIEmbedding(
        model="text-embedding-3-small", api_base=f"{server}/v1", api_key=key, max_retries=0
    )
    assert_minilms(embeddings.get_text_embedding_batch(DOCUMENTS), minilm(DOCUMENTS))
    assert_minilms([embeddings.get_query_embedding(QUERY)], minilm([QUERY]))
    sized = OpenAIEmbedding(
        model="text-embedding-3-small",
        dimensions=1536,
        api_base=f"{server}/v1",
        api_key=key,
        max_retries=0,
    )
    with pytest.raises(openai.BadRequestError, match="384-dimensional"):
        sized.get_query_embedding(QUERY)
    # Unserved, OpenAI's default model name is a 404 listing the names that work.
    default = OpenAIEmbedding(api_base=f"{server}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.NotFoundError, match="embedding models: minilm"):
        default.get_query_embedding(QUERY)
