"""One text alone on ONNX Runtime (inference/lone.py), on the packaged all-MiniLM-L6-v2:
torch's vectors, only where it applies, and torch's forward kept wherever it fails."""

from __future__ import annotations

import logging
import re
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

from core.config.settings import Settings, SettingsError
from inference import Encoder
from inference import lone as lone_module
from inference.lone import OnnxSingleText
from tests.unit.test_packed import TEXTS as PACKED_TEXTS

pytestmark = pytest.mark.slow  # exports the model to ONNX and loads sessions for seconds

TEXTS = [t for t in PACKED_TEXTS if len(t) < 100 or t.startswith("word")]


@pytest.fixture(scope="module")
def reference():
    torch.set_num_threads(1)
    return Encoder(precision="fp32", packed=False)


@pytest.fixture(scope="module")
def fp32_lone():
    encoder = Encoder(precision="fp32")
    assert encoder.run_lone_texts("auto", 2) == "onnxruntime fp32 on 2 threads"
    return encoder


class Counted:
    """The session's own calls, counted (the real ONNX Runtime session runs them)."""

    def __init__(self, lone: OnnxSingleText) -> None:
        self.calls = 0
        self._run = lone.mean_pooled

    def __call__(self, inputs):  # noqa: ANN001, ANN204
        self.calls += 1
        return self._run(inputs)


def in_threads(threads: int, fn):  # noqa: ANN001, ANN201
    """`fn()` on a new thread whose torch thread count is `threads` (as a model thread's)."""
    out = {}

    def body() -> None:
        torch.set_num_threads(threads)
        out["value"] = fn()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return out["value"]


def test_each_text_alone_gets_torchs_fp32_vector(reference, fp32_lone, monkeypatch):
    counted = Counted(fp32_lone.lone)
    monkeypatch.setattr(fp32_lone.lone, "mean_pooled", counted)
    for text in TEXTS:
        want = reference.encode([text])
        got = in_threads(2, lambda t=text: fp32_lone.encode([t]))
        assert got.shape == want.shape == (1, 384)
        assert F.cosine_similarity(want, got).item() > 0.999999
        assert (want - got).abs().max().item() < 2e-5
        assert abs(got.norm().item() - 1) < 1e-5
    assert counted.calls == len(TEXTS)


def test_only_a_single_text_with_every_thread_goes_to_onnx_runtime(fp32_lone, monkeypatch):
    counted = Counted(fp32_lone.lone)
    monkeypatch.setattr(fp32_lone.lone, "mean_pooled", counted)
    # A model thread with its share of the cores (batches side by side): torch.
    in_threads(1, lambda: fp32_lone.encode(["alone, but on one thread"]))
    assert counted.calls == 0
    # Several texts, even with every core: torch's packed forward (no padding).
    in_threads(2, lambda: fp32_lone.encode(TEXTS[:3]))
    assert counted.calls == 0
    # A long list's last micro-batch of one text is a batch of one too.
    in_threads(2, lambda: fp32_lone.encode(TEXTS[:3], batch_size=2))
    assert counted.calls == 1
    in_threads(2, lambda: fp32_lone.encode(["alone with both cores"]))
    assert counted.calls == 2


def test_fp16_weights_export_their_fp32_weights(reference):
    half = Encoder(precision="fp16")
    assert half.run_lone_texts("auto", 2) == "onnxruntime fp32 on 2 threads"
    # The trace records fp32 products (FBGEMM's fp16 one has no ONNX operator): the
    # session's vectors are fp32's, the fp16 weights' within their own rounding.
    for text in TEXTS[1:4]:
        want = reference.encode([text])
        lone = in_threads(2, lambda t=text: half.encode([t]))
        torch_half = in_threads(1, lambda t=text: half.encode([t]))
        assert F.cosine_similarity(want, lone).item() > 0.999999
        assert F.cosine_similarity(want, torch_half).item() > 0.99999


def test_concurrent_lone_texts_get_their_own_vectors(reference, fp32_lone):
    texts = [f"request {n}: my parcel is late" for n in range(6)]
    got: dict[int, torch.Tensor] = {}

    def one(n: int) -> None:
        torch.set_num_threads(2)
        for _ in range(3):
            got[n] = fp32_lone.encode([texts[n]])

    threads = [threading.Thread(target=one, args=(n,)) for n in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    want = reference.encode(texts)
    for n in range(len(texts)):
        assert F.cosine_similarity(want[n : n + 1], got[n]).item() > 0.999999


@pytest.mark.parametrize(
    ("runtime", "precision", "device", "reason"),
    [
        ("torch", "fp32", "cpu", "LANEWAY_LONE_RUNTIME=torch"),
        ("auto", "bf16", "cpu", "bf16 runs in oneDNN's products"),
        ("onnxruntime", "fp16", "cuda", "not measured on cuda"),
        ("auto", "fp32", "cpu", ""),
        ("onnxruntime", "fp16", "cpu", ""),
    ],
)
def test_where_onnx_runtime_applies(runtime, precision, device, reason):
    got = lone_module.why_not(runtime, torch.device(device), precision)
    assert got.startswith(reason) and bool(got) == bool(reason)


@pytest.mark.parametrize("missing", ["onnxruntime", "onnx"])
def test_without_onnx_runtime_installed_torch_runs_it(fp32_lone, monkeypatch, caplog, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # what an import finds uninstalled
    assert lone_module.why_not("auto", torch.device("cpu"), "fp32") == f"{missing} is not installed"
    encoder = Encoder.__new__(Encoder)
    encoder.__dict__.update(fp32_lone.__dict__, lone=None)
    with caplog.at_level(logging.WARNING, logger="inference.encoder"):
        assert encoder.run_lone_texts("auto", 2) == f"torch ({missing} is not installed)"
        assert not caplog.records  # auto: torch, quietly
        encoder.run_lone_texts("onnxruntime", 2)
    assert encoder.lone is None
    assert f"LANEWAY_LONE_RUNTIME=onnxruntime, but {missing} is not installed" in caplog.text


def test_a_session_that_disagrees_with_torch_is_not_used(fp32_lone, caplog):
    wrong = lambda inputs: -fp32_lone._pooled(inputs)  # noqa: E731 - a wrong graph's vectors
    with caplog.at_level(logging.WARNING, logger="inference.lone"):
        assert OnnxSingleText.build(fp32_lone.model, 2, wrong) is None
    # The negated vectors' cosine, -1 to float32's rounding (-1.0000001 on some CPUs).
    assert re.search(r"ONNX Runtime agreed to cosine -(1\.0000\d*|0\.9999\d*) only", caplog.text)


def test_a_model_that_does_not_export_keeps_torch(caplog):
    with caplog.at_level(logging.WARNING, logger="inference.lone"):
        assert OnnxSingleText.build(torch.nn.Linear(4, 4), 2, lambda inputs: None) is None
    assert "one text alone keeps torch's forward: ONNX Runtime failed" in caplog.text


def test_the_setting_reads_any_case_and_refuses_others():
    assert Settings().lone_runtime == "auto"
    assert Settings.from_env({"LANEWAY_LONE_RUNTIME": " Torch "}).lone_runtime == "torch"
    assert Settings.from_env({"LANEWAY_LONE_RUNTIME": "ONNXRUNTIME"}).lone_runtime == (
        "onnxruntime"
    )
    with pytest.raises(SettingsError, match="LANEWAY_LONE_RUNTIME"):
        Settings.from_env({"LANEWAY_LONE_RUNTIME": "onnx"})
