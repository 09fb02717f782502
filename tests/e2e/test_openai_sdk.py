"""The real `openai` SDK, sync and async, against `laneway web` (gunicorn) and a real
interactive worker: its vectors are /v1/embed's, its usage the tokenizer's counts, its
models list the names it may embed with, its errors the SDK's exceptions. With a cpu worker
beside them, the examples of docs/client.md, docs/openai.md and docs/getting-started.md run
as written, and `laneway submit` goes through the same client."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import openai
import pytest
from transformers import AutoTokenizer

from inference.encoder import default_model_path
from tests.e2e.procs import BIN, all_or_none, http, start_web, start_worker, wait_ready
from tests.faults.harness import cpu_worker

pytestmark = pytest.mark.e2e
DOCS = Path(__file__).resolve().parents[2] / "docs"
# A list past 8 texts goes as several interactive requests; past 40 it is refused. The
# served names are an operator's: one of their own, and an OpenAI name for a tool that
# takes no other (docs/openai.md, "Model names").
SERVED = ["support-embeddings", "text-embedding-3-small"]
WEB_ENV = {
    "LANEWAY_SYNC_MAX_ITEMS": "8",
    "LANEWAY_EMBEDDINGS_MAX_INPUTS": "40",
    "LANEWAY_SERVED_MODEL_NAMES": ",".join(SERVED),
}
NAMES = ["minilm", *SERVED, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"]
LOGS: dict[str, Path] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory, settings, migrated):
    from tests.broker import empty_queues

    empty_queues(settings)
    logdir = tmp_path_factory.mktemp("openai-sdk")
    argv = [str(BIN / "laneway"), "worker", "interactive", "--name", "openai-sdk"]
    with all_or_none():
        interactive = start_worker("openai-sdk", argv, logdir, wait=False)
        batch = cpu_worker(logdir, "cpu-openai-sdk", wait=False)
        web, url = start_web(logdir, env=WEB_ENV)  # while the workers load their models
        wait_ready({interactive: "openai-sdk", batch: "cpu"})
    LOGS["interactive"] = interactive.log
    yield url
    for proc in (batch, interactive, web):
        proc.stop()


@pytest.fixture
def key(account_factory):
    return account_factory("standard")[1]


def sdk(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def async_sdk(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def laneway_embed(url: str, key: str, texts: list[str]) -> list[dict]:
    items = [{"id": str(n), "text": t} for n, t in enumerate(texts)]
    r = http.post(
        f"{url}/v1/embed", json={"items": items}, headers={"Authorization": f"Bearer {key}"}
    )
    assert r.status_code == 200, r.text
    return r.json()["results"]


def test_the_sdk_gets_lanewayss_vectors_and_real_token_counts(server, key):
    texts = [f"message number {n}: my parcel is late and I want a refund" for n in range(20)]
    texts[3] = "hi"
    client = sdk(server, key)
    floats = client.embeddings.create(model="minilm", input=texts, encoding_format="float")
    # Asked for nothing, the SDK asks for base64 and decodes it itself.
    default = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    b64 = client.embeddings.with_raw_response.create(
        model="minilm", input=texts[:2], encoding_format="base64"
    )
    assert [d.index for d in floats.data] == list(range(20)) and floats.model == "minilm"
    ours = np.array([r["embedding"] for r in laneway_embed(server, key, texts[:8])])
    for answer in (floats, default):
        vectors = np.array([d.embedding for d in answer.data])
        assert vectors.shape == (20, 384)
        cosine = (vectors[:8] * ours).sum(axis=1) / np.linalg.norm(vectors[:8], axis=1)
        assert cosine.min() > 0.9999, cosine
    raw = b64.http_response.json()["data"][1]["embedding"]
    decoded = np.frombuffer(base64.b64decode(raw), dtype="<f4")
    # The same vector, computed again in another batch: at bf16 a text's vector moves by
    # up to ~5e-4 with the batch it shares (other token counts, other kernels).
    again = np.array(floats.data[1].embedding)
    assert isinstance(raw, str) and decoded.shape == again.shape
    assert np.abs(decoded - again).max() < 2e-3 and decoded @ again > 0.9999
    # The tokenizer's own count, special tokens in: what the model read.
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    tokens = sum(len(tokenizer(t)["input_ids"]) for t in texts)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == tokens
    assert default.usage.prompt_tokens == tokens


def test_a_lone_text_gets_torchs_fp32_vector_from_onnx_runtime(server, key):
    """One text alone runs on the interactive worker's ONNX Runtime session (its log says
    so) where the CPU has no native bf16: the vector of the model itself in fp32, in this
    process. A bf16 CPU keeps torch's bf16 forward, within bf16's rounding."""
    from inference.encoder import Encoder
    from inference.precision import choose

    onnx = choose("auto", "cpu").precision != "bf16"
    texts = ["hi", "my parcel never arrived and nobody answers my emails", "word " * 300]
    got = np.array([laneway_embed(server, key, [t])[0]["embedding"] for t in texts])
    want = Encoder(precision="fp32", packed=False).encode(texts).numpy()
    assert (got * want).sum(axis=1).min() > (0.99999 if onnx else 0.9999)
    # This worker has one torch thread (the test settings): so has its session.
    runs = r"onnxruntime fp32 on 1 thread$" if onnx else r"torch \(bf16 runs"
    assert re.search(f"one text alone: {runs}", LOGS["interactive"].read_text(), re.M)


def test_the_sdks_errors(server, key):
    with pytest.raises(openai.AuthenticationError):
        sdk(server, "lw_not_a_key").embeddings.create(model="minilm", input="hello")
    client = sdk(server, key)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="minilm", input=[f"t{n}" for n in range(41)])
    message = err.value.body["message"]
    assert "at most 40" in message and "LANEWAY_EMBEDDINGS_MAX_INPUTS" in message
    assert err.value.body["param"] == "input"
    with pytest.raises(openai.BadRequestError, match="384-dimensional"):
        client.embeddings.create(model="minilm", input="hello", dimensions=256)
    with pytest.raises(openai.BadRequestError, match="token ids"):
        client.embeddings.create(model="minilm", input=[[101, 7592, 102]])
    with pytest.raises(openai.NotFoundError, match="embedding models: minilm, support-emb"):
        client.embeddings.create(model="text-embedding-3-large", input="hello")
    with pytest.raises(openai.NotFoundError, match="does not exist here") as err:
        client.models.retrieve("text-embedding-3-large")
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        sdk(server, "lw_not_a_key").models.list()
    assert client.embeddings.create(model="minilm", input="hello", dimensions=384).data


def test_the_sdk_lists_and_retrieves_the_models(server, key):
    client = sdk(server, key)
    models = list(client.models.list())
    assert [m.id for m in models] == NAMES
    assert {(m.object, m.owned_by) for m in models} == {("model", "laneway")}
    assert all(isinstance(m.created, int) and m.created > 0 for m in models)
    # The SDK percent-encodes a slash in the id; the server reads it back.
    for name in NAMES:
        assert client.models.retrieve(name).id == name
    # Every listed name embeds, with the one model: its vectors, its size.
    text = "where is my parcel?"
    vectors = [client.embeddings.create(model=n, input=text).data[0].embedding for n in NAMES]
    assert {len(v) for v in vectors} == {384}
    assert min(float(np.dot(vectors[0], v)) for v in vectors) > 0.9999


def test_the_async_sdk(server, key):
    texts = [f"async message {n}: refund my order" for n in range(12)]

    async def calls():
        async with async_sdk(server, key) as client:
            answers = await asyncio.gather(
                client.embeddings.create(model="minilm", input=texts[:6]),
                client.embeddings.create(model="support-embeddings", input=texts[6:]),
                client.embeddings.create(model="minilm", input="hi", encoding_format="float"),
            )
            listed = [m.id async for m in client.models.list()]
            one = await client.models.retrieve("sentence-transformers/all-MiniLM-L6-v2")
            with pytest.raises(openai.BadRequestError, match="check_embedding_ctx_length"):
                await client.embeddings.create(model="minilm", input=[[101, 7592, 102]])
            return answers, listed, one

    answers, listed, one = asyncio.run(calls())
    vectors = np.array([d.embedding for a in answers[:2] for d in a.data])
    ours = np.array([r["embedding"] for r in laneway_embed(server, key, texts[:8])])
    assert vectors.shape == (12, 384) and len(answers[2].data[0].embedding) == 384
    assert ((vectors[:8] * ours).sum(axis=1)).min() > 0.9999
    assert listed == NAMES and (one.id, one.object) == (NAMES[-1], "model")


def python_blocks(doc: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)


@pytest.mark.parametrize("doc", ["client.md", "openai.md", "getting-started.md"])
def test_the_docs_examples_run(server, key, doc, monkeypatch):
    monkeypatch.setenv("LANEWAY_URL", server)
    monkeypatch.setenv("LANEWAY_API_KEY", key)
    blocks = python_blocks(DOCS / doc)
    assert blocks
    namespace: dict = {}
    for n, block in enumerate(blocks):
        code = compile(block, f"{doc} block {n + 1}", "exec")
        exec(code, namespace)  # noqa: S102 - the documentation's own examples


def test_the_cli_submits_through_the_client(server, key, tmp_path):
    path = tmp_path / "upload.csv"
    path.write_text("id,text\n1,refund my order please\n2,the parcel never arrived\n")
    done = subprocess.run(
        [str(BIN / "laneway"), "submit", str(path), "--wait", "--url", server],
        capture_output=True,
        text=True,
        env={**os.environ, "LANEWAY_API_KEY": key},
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "queued on the cpu lane" in done.stdout and "2 succeeded, 0 failed" in done.stdout
    assert "uploading upload.csv" in done.stderr and "job " in done.stderr
    refused = subprocess.run(
        [str(BIN / "laneway"), "submit", str(path), "--url", server],
        capture_output=True,
        text=True,
        env={**os.environ, "LANEWAY_API_KEY": "lw_wrong"},
        timeout=60,
    )
    assert refused.returncode == 1 and "401 unauthorized" in refused.stderr
