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
from inference import lone as lone_module
from inference.encoder import Encoder
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


# --- the kept export (Exports) ----------------------------------------------------------


class CountedExport:
    """inference/lone.py's own export, counted."""

    def __init__(self) -> None:
        self.calls = 0
        self._export = lone_module.export

    def __call__(self, model):  # noqa: ANN001, ANN204
        self.calls += 1
        return self._export(model)


def build(encoder: Encoder, exports, key: str):  # noqa: ANN001, ANN201
    return OnnxSingleText.build(encoder.model, 2, encoder._pooled, exports, key)


def assert_matches_torch(lone: OnnxSingleText, reference: Encoder) -> None:
    inputs = reference.tokenizer(["one short text"], return_tensors="pt")
    with torch.inference_mode():
        want = reference._pooled(dict(inputs))
    got = lone.mean_pooled(dict(inputs))
    assert F.cosine_similarity(want, got, dim=1).min().item() > 0.99999


def test_a_passed_export_is_kept_and_opened_instead_of_exported(reference, tmp_path, monkeypatch):
    counted = CountedExport()
    monkeypatch.setattr(lone_module, "export", counted)
    exports = lone_module.Exports(tmp_path / "onnx-exports")
    key = lone_module.Exports.key(reference.model_path, "fp32")
    first = build(reference, exports, key)
    assert first is not None and counted.calls == 1
    assert [p.name for p in exports.folder.iterdir()] == [f"{key}.onnx"]  # no temporary left
    second = build(reference, exports, key)  # a worker starting again
    assert second is not None and counted.calls == 1
    assert_matches_torch(second, reference)


@pytest.mark.parametrize("damage", ["garbage", "empty", "another model's graph"])
def test_a_kept_export_that_fails_is_exported_again_and_replaced(
    reference, tmp_path, monkeypatch, damage
):
    exports = lone_module.Exports(tmp_path / "onnx-exports")
    key = lone_module.Exports.key(reference.model_path, "fp32")
    if damage == "another model's graph":
        other = Encoder(precision="fp32", packed=False)
        with torch.no_grad():
            for p in other.model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        exports.write(key, lone_module.export(other.model))
    else:
        exports.write(key, b"" if damage == "empty" else b"\x08\x07not an onnx graph")
    counted = CountedExport()
    monkeypatch.setattr(lone_module, "export", counted)
    lone = build(reference, exports, key)
    assert lone is not None and counted.calls == 1
    assert_matches_torch(lone, reference)
    assert build(reference, exports, key) is not None and counted.calls == 1  # replaced


def test_the_key_follows_the_model_files_the_precision_and_the_exporter(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    weights.write_bytes(b"weights")
    keys = {lone_module.Exports.key(str(model), "fp32")}
    assert lone_module.Exports.key(str(model), "fp32") in keys  # the same inputs, the same key
    keys.add(lone_module.Exports.key(str(model), "fp16"))
    weights.write_bytes(b"weights, retrained")  # replaced in place
    keys.add(lone_module.Exports.key(str(model), "fp32"))
    monkeypatch.setattr(lone_module, "OPSET", lone_module.OPSET + 1)
    keys.add(lone_module.Exports.key(str(model), "fp32"))
    assert len(keys) == 4


def test_an_unwritable_folder_only_means_exporting_each_time(reference, tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the folder would be")
    exports = lone_module.Exports(blocked / "onnx-exports")
    key = lone_module.Exports.key(reference.model_path, "fp32")
    counted = CountedExport()
    monkeypatch.setattr(lone_module, "export", counted)
    assert build(reference, exports, key) is not None
    assert build(reference, exports, key) is not None and counted.calls == 2
