"""The precision per device (inference/precision.py): the choice, torch's answer about the
CPU, the comparison against fp32, and the start-up check on real models."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from core.config.settings import Settings
from core.vocab import DEFAULT_LABELS, PRECISIONS
from inference import accuracy, halfweights
from inference import precision as prec
from inference.accuracy import Tolerance, compare, load_checked, load_sample
from inference.encoder import Encoder
from inference.ner import TokenClassifier
from inference.pipeline import Pipeline
from inference.precision import Choice, choose
from inference.seqcls import SequenceClassifier
from tests.tiny_models import make_seqcls_model, make_token_model

ANCHORS = Settings().score_anchors


@pytest.fixture
def bf16_cpu(monkeypatch):
    """Pretend the CPU does (True) or does not (False) compute bf16 natively."""

    def set_native(native: bool) -> None:
        monkeypatch.setattr(prec, "native_bf16_cpu", lambda: native)

    return set_native


@pytest.fixture
def half_cpu(monkeypatch):
    """Pretend the CPU does (True) or does not (False) run fp16-weight products."""

    def set_available(available: bool) -> None:
        monkeypatch.setattr(halfweights, "available", lambda: available)

    return set_available


def test_auto_is_fp16_on_cuda_bf16_on_a_native_cpu_fp16_weights_on_avx2_else_fp32(
    bf16_cpu, half_cpu
):
    assert choose("auto", "cuda") == Choice("fp16")
    # The deprecated LANEWAY_CUDA_HALF=false keeps CUDA in fp32, and touches no CPU.
    assert choose("auto", "cuda", cuda_half=False) == Choice("fp32")
    half_cpu(True)
    bf16_cpu(True)
    assert choose("auto", "cpu") == Choice("bf16")
    assert choose("auto", "cpu", cuda_half=False) == Choice("bf16")
    bf16_cpu(False)
    assert choose("auto", "cpu") == Choice("fp16")
    assert choose("auto", "cpu", cuda_half=False) == Choice("fp16")
    half_cpu(False)
    assert choose("auto", "cpu") == Choice("fp32")


def test_an_explicit_precision_the_device_cannot_run_falls_back_to_fp32(bf16_cpu, half_cpu):
    bf16_cpu(False)
    assert choose("bf16", "cpu") == Choice("fp32", "bf16 is not computed natively on cpu")
    bf16_cpu(True)
    assert choose("bf16", "cpu") == Choice("bf16")
    # fp16 on a CPU is fp16 weights in fp32 arithmetic, where FBGEMM runs them.
    half_cpu(True)
    assert choose("fp16", "cpu") == Choice("fp16")
    half_cpu(False)
    assert choose("fp16", "cpu") == Choice("fp32", "fp16 is not computed natively on cpu")
    assert choose("fp32", "cpu") == Choice("fp32")
    assert choose("fp16", "cuda") == Choice("fp16")
    assert choose("fp32", "cuda") == Choice("fp32")


@pytest.mark.parametrize(
    "engines,caps,available",
    [
        (["x86", "fbgemm", "onednn"], {"avx2": True, "f16c": True}, True),  # AMD Zen 2/3
        (["x86", "fbgemm"], {"avx2": True, "avx512_bf16": True, "f16c": True}, True),
        (["x86", "fbgemm"], {"avx": True, "f16c": True}, False),  # no AVX2: FBGEMM cannot
        (["x86", "fbgemm"], {"avx2": True, "f16c": False}, False),
        (["qnnpack"], {"architecture": "aarch64"}, False),  # an Arm build has no FBGEMM
    ],
)
def test_fp16_weights_need_fbgemm_and_avx2(monkeypatch, engines, caps, available):
    monkeypatch.setattr(halfweights, "engines", lambda: engines)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    assert halfweights.available() is available


@pytest.mark.parametrize("setting", ["", "int8", "FP32", "half", None])
def test_an_unknown_precision_is_refused(setting):
    with pytest.raises(ValueError, match="unknown precision"):
        choose(setting, "cpu")  # type: ignore[arg-type]


def test_settings_and_the_loader_know_the_same_precisions():
    assert prec.PRECISIONS == PRECISIONS


@pytest.mark.parametrize(
    "caps,mkldnn,native",
    [
        ({"avx512_bf16": True, "avx512_f": True}, True, True),  # AMD Zen 4, Intel Cooper Lake
        ({"amx_bf16": True, "amx_tile": True}, True, True),  # Intel Sapphire Rapids
        ({"bf16": True, "architecture": "aarch64"}, True, True),  # Arm BF16 extension
        ({"avx512_f": True, "avx512_bw": True}, True, False),  # AVX512 without bf16: emulated
        ({"avx2": True}, True, False),
        ({"avx512_bf16": True}, False, False),  # a torch build without oneDNN
    ],
)
def test_native_bf16_asks_torch_for_the_cpu_capabilities(monkeypatch, caps, mkldnn, native):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: mkldnn)
    assert prec.native_bf16_cpu() is native


def test_runtime_label_names_torch_precision_and_device():
    label = prec.runtime_label("bf16", "cpu")
    assert label == f"torch {torch.__version__.split('+')[0]} bf16 cpu"
    assert "+" not in label


def test_the_packaged_sample_has_labelled_texts():
    sample = load_sample()
    assert 100 <= len(sample.texts) <= 200
    assert len(set(sample.texts)) == len(sample.texts)
    assert set(sample.labels) == set(DEFAULT_LABELS)


def _outs(vectors, labels, ratings):
    return {
        "vectors": torch.nn.functional.normalize(torch.tensor(vectors), dim=1),
        "labels": torch.tensor(labels),
        "ratings": torch.tensor(ratings),
    }


def test_compare_judges_each_measure_against_its_tolerance():
    want = _outs([[1.0, 0.0], [0.0, 1.0]], [0, 1], [0.5, -0.5])
    assert compare(want, want, Tolerance()).ok
    # Each measure alone fails the check, and says so.
    turned = _outs([[1.0, 0.1], [0.0, 1.0]], [0, 1], [0.5, -0.5])  # cosine 0.995
    flipped = _outs([[1.0, 0.0], [0.0, 1.0]], [0, 0], [0.5, -0.5])
    drifted = _outs([[1.0, 0.0], [0.0, 1.0]], [0, 1], [0.5, -0.47])
    for got, failure in ((turned, "cosine"), (flipped, "labels"), (drifted, "ratings")):
        verdict = compare(want, got, Tolerance())
        assert not verdict.ok and len(verdict.failures) == 1 and failure in verdict.failures[0]
    # At the bounds it passes: 1 label in 100 changed, a rating off by exactly 0.02.
    many = {"labels": torch.zeros(100, dtype=torch.long), "ratings": torch.zeros(100)}
    one_changed = torch.cat([torch.ones(1), torch.zeros(99)]).long()
    edge = {"labels": one_changed, "ratings": many["ratings"]}
    assert compare(many, edge, Tolerance()).ok
    assert compare(many, {**edge, "labels": edge["labels"] * 0 + 1}, Tolerance()).ok is False
    assert compare(
        {"labels": torch.zeros(1), "ratings": torch.zeros(1)},
        {"labels": torch.zeros(1), "ratings": torch.tensor([0.02])},
        Tolerance(),
    ).ok


@pytest.fixture(scope="module")
def minilm_build():
    torch.set_num_threads(1)
    return lambda precision: Encoder(precision=precision)


@pytest.mark.slow
@pytest.mark.skipif(not prec.native_bf16_cpu(), reason="this CPU has no native bf16")
def test_bf16_passes_the_check_on_this_cpu(minilm_build, caplog):
    caplog.set_level(logging.INFO, logger="inference.accuracy")
    model = load_checked(minilm_build, "bf16", ANCHORS, name="minilm")
    assert (model.precision, model.mixed) == ("bf16", True)
    assert model.runtime.endswith(" bf16 cpu")
    # The fixed texts (labels, anchors) go through the kept fp32 twin.
    assert model.fixed_encoder is not None and model.fixed_encoder.precision == "fp32"
    assert "minilm: bf16 passed the precision check" in caplog.text
    # Served through the pipeline, its outputs stay within the tolerance of fp32's.
    texts, labels = load_sample().texts[:40], list(DEFAULT_LABELS)
    ref = minilm_build("fp32")
    tasks = ["classify", "score", "embed"]
    got, _ = Pipeline(lambda task: model, ANCHORS).run(texts, tasks, labels)
    want, _ = Pipeline(lambda task: ref, ANCHORS).run(texts, tasks, labels)
    assert sum(a["label"] == b["label"] for a, b in zip(want, got, strict=True)) >= 39
    assert max(abs(a["rating"] - b["rating"]) for a, b in zip(want, got, strict=True)) <= 0.02


@pytest.mark.slow
def test_a_failed_check_falls_back_to_fp32_and_says_why(minilm_build, caplog):
    caplog.set_level(logging.INFO, logger="inference.accuracy")
    # No reduced precision reaches a cosine over 1: the check must fail.
    model = load_checked(minilm_build, "bf16", ANCHORS, name="minilm", tolerance=Tolerance(1.0001))
    assert model.precision == "fp32" and model.fixed_encoder is None
    warning = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1
    assert "minilm: bf16 failed the precision check" in warning[0].message
    assert "running in fp32 instead" in warning[0].message and "cosine" in warning[0].message


@pytest.mark.slow
def test_a_degraded_model_fails_the_check(minilm_build, caplog):
    def degraded(precision):
        model = minilm_build(precision)
        if precision != "fp32":  # the "reduced" copy: its weights visibly damaged
            torch.manual_seed(0)
            with torch.no_grad():
                for p in model.model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
        return model

    caplog.set_level(logging.WARNING, logger="inference.accuracy")
    assert load_checked(degraded, "bf16", ANCHORS).precision == "fp32"
    assert "failed the precision check" in caplog.text


def test_fp32_loads_once_and_is_not_checked(caplog):
    calls = []
    caplog.set_level(logging.INFO, logger="inference.accuracy")
    assert load_checked(lambda p: calls.append(p) or p, "fp32", ANCHORS) == "fp32"
    assert calls == ["fp32"] and caplog.text == ""


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-precision")
    return {
        "sentiment": make_seqcls_model(root / "sentiment", ["negative", "neutral", "positive"]),
        "topics": make_seqcls_model(root / "topics", ["sports", "politics", "tech"]),
        "ner": make_token_model(root / "ner", ["O", "B-PER", "I-PER", "B-ORG", "I-ORG"]),
    }


@pytest.mark.parametrize(
    "name,cls,keys",
    [
        ("sentiment", SequenceClassifier, {"labels", "ratings"}),  # its labels make a rating
        ("topics", SequenceClassifier, {"labels", "probabilities"}),  # no rating: probabilities
        ("ner", TokenClassifier, {"labels", "probabilities"}),  # each real token's tag
    ],
)
def test_classifiers_are_checked_on_labels_and_ratings_or_probabilities(
    tiny_dirs, caplog, name, cls, keys
):
    def build(precision):
        return cls(str(tiny_dirs[name]), precision=precision)

    sample = load_sample()
    outs = accuracy.outputs(build("fp32"), sample, ANCHORS)
    assert set(outs) == keys
    if cls is SequenceClassifier:
        assert len(outs["labels"]) == len(sample.texts)
    else:  # every non-padding token of every text, special tokens included
        assert len(outs["labels"]) > len(sample.texts)
    # A tolerance nothing meets fails them too, back to fp32 with the reason logged.
    caplog.set_level(logging.WARNING, logger="inference.accuracy")
    model = load_checked(build, "bf16", ANCHORS, name=name, tolerance=Tolerance(labels=1.01))
    assert model.precision == "fp32"
    assert f"{name}: bf16 failed the precision check" in caplog.text
    assert "labels unchanged" in caplog.text


def test_a_bf16_classifier_keeps_its_outputs_close_to_fp32(tiny_dirs):
    fp32 = SequenceClassifier(str(tiny_dirs["sentiment"]))
    bf16 = SequenceClassifier(str(tiny_dirs["sentiment"]), precision="bf16")
    texts = load_sample().texts[:20]
    diff = (fp32.predict(texts) - bf16.predict(texts)).abs().max().item()
    assert bf16.predict(texts).dtype == torch.float32 and diff < 0.02


def _worker_settings(**env):
    return Settings.from_env({"LANEWAY_TORCH_THREADS": "1", **env})


def test_a_worker_refusing_a_precision_loads_fp32_and_logs_why(caplog, half_cpu):
    from workers.model_host import load_model

    half_cpu(False)
    caplog.set_level(logging.WARNING)
    settings = _worker_settings(LANEWAY_PRECISION="fp16")
    model = load_model(settings.models["minilm"], settings, "cpu")
    assert model.precision == "fp32" and model.runtime.endswith(" fp32 cpu")
    assert "LANEWAY_PRECISION=fp16, but fp16 is not computed natively on cpu" in caplog.text


@pytest.mark.slow
def test_a_gpu_worker_falling_back_to_the_cpu_follows_the_cpu_rules(monkeypatch):
    from workers import devices
    from workers.model_host import get_pipeline

    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    settings = _worker_settings(LANEWAY_GPU_FALLBACK="cpu")
    assert devices.check_lane("gpu", settings) == "cpu"
    pipeline = get_pipeline(settings)
    expected = choose("auto", "cpu").precision  # bf16 on this CPU where it has native bf16
    runtime = pipeline.runtime(["classify", "score"])
    assert runtime == {"precision": expected, "runtime": prec.runtime_label(expected, "cpu")}
    assert pipeline.resolve("classify").precision == expected
    # A job that runs no model (extract by patterns alone) records none.
    assert pipeline.runtime(["extract"]) == {"precision": None, "runtime": None}


# --- the verdicts kept between worker starts (Verdicts) ------------------------------------


@pytest.fixture
def counted(tiny_dirs):
    """A tiny classifier's build that records each precision it was asked for."""
    calls: list[str] = []

    def build(precision):
        calls.append(precision)
        return SequenceClassifier(str(tiny_dirs["sentiment"]), precision=precision)

    return build, calls


def verdict_key(path, precision="bf16", tolerance=accuracy.TOLERANCE, **settings):
    return accuracy.Verdicts.key(str(path), precision, "cpu", ANCHORS, tolerance, **settings)


def test_a_kept_verdict_spares_the_check_at_the_next_start(tiny_dirs, counted, tmp_path, caplog):
    build, calls = counted
    verdicts = accuracy.Verdicts(tmp_path / "checks")
    key = verdict_key(tiny_dirs["sentiment"])
    caplog.set_level(logging.INFO, logger="inference.accuracy")
    first = load_checked(build, "bf16", ANCHORS, name="m", verdicts=verdicts, key=key)
    assert calls == ["fp32", "bf16"] and first.precision == "bf16"
    assert "m: bf16 passed the precision check against fp32 on" in caplog.text
    kept = verdicts.get(key)
    assert kept is not None and kept.ok and kept.measures["labels_unchanged"] >= 0.99
    calls.clear()
    caplog.clear()
    again = load_checked(build, "bf16", ANCHORS, name="m", verdicts=verdicts, key=key)
    assert calls == ["bf16"] and again.precision == "bf16"  # no fp32 twin, no forwards
    assert f"m: bf16 passed the precision check against fp32 (kept in {verdicts.folder})" in (
        caplog.text
    )


def test_a_kept_failure_loads_fp32_at_once_and_says_why(tiny_dirs, counted, tmp_path, caplog):
    build, calls = counted
    verdicts = accuracy.Verdicts(tmp_path)
    never = Tolerance(labels=1.01)
    key = verdict_key(tiny_dirs["sentiment"], tolerance=never)
    caplog.set_level(logging.WARNING, logger="inference.accuracy")
    model = load_checked(build, "bf16", ANCHORS, "m", never, verdicts=verdicts, key=key)
    assert model.precision == "fp32" and not verdicts.get(key).ok
    calls.clear()
    caplog.clear()
    model = load_checked(build, "bf16", ANCHORS, "m", never, verdicts=verdicts, key=key)
    assert model.precision == "fp32" and calls == ["fp32"]
    assert "m: bf16 failed the precision check" in caplog.text and "kept in" in caplog.text
    assert "labels unchanged" in caplog.text


def test_the_key_changes_with_everything_the_verdict_depends_on(tmp_path):
    model = make_seqcls_model(tmp_path / "m", ["a", "b"])
    base = verdict_key(model, batch_size=32)
    assert verdict_key(model, batch_size=32) == base  # stable
    assert verdict_key(model, "fp16", batch_size=32) != base
    assert verdict_key(model, batch_size=64) != base
    assert verdict_key(model, tolerance=Tolerance(cosine=0.9), batch_size=32) != base
    assert (
        accuracy.Verdicts.key(str(model), "bf16", "cpu", ["x"], Tolerance(), batch_size=32) != base
    )
    # Weights replaced in place (same name): another size or another modification time.
    weights = next(p for p in model.iterdir() if p.suffix in (".safetensors", ".bin"))
    data = weights.read_bytes()
    weights.write_bytes(data + b"\0")
    grown = verdict_key(model, batch_size=32)
    weights.write_bytes(data)
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert len({base, grown, verdict_key(model, batch_size=32)}) == 3


@pytest.mark.parametrize(
    "kept", ["not json", '{"ok": true}', '["ok"]', "", '{"ok": 1, "measures": 2}']
)
def test_an_unreadable_verdict_is_no_verdict(tmp_path, kept):
    (tmp_path / "k.json").write_text(kept)
    assert accuracy.Verdicts(tmp_path).get("k") is None


def test_the_check_runs_again_over_an_unreadable_verdict_and_keeps_its_own(
    tiny_dirs, counted, tmp_path
):
    build, calls = counted
    verdicts = accuracy.Verdicts(tmp_path)
    key = verdict_key(tiny_dirs["sentiment"])
    (tmp_path / f"{key}.json").write_text('{"ok": tr')  # a write cut short
    load_checked(build, "bf16", ANCHORS, verdicts=verdicts, key=key)
    assert calls == ["fp32", "bf16"] and verdicts.get(key).ok
    assert [p.name for p in tmp_path.iterdir()] == [f"{key}.json"]  # no temporary file left


def test_a_folder_that_cannot_be_written_only_means_checking_every_time(
    tiny_dirs, counted, tmp_path
):
    build, calls = counted
    blocker = tmp_path / "checks"
    blocker.write_text("a file where the folder would be")
    verdicts = accuracy.Verdicts(blocker)
    key = verdict_key(tiny_dirs["sentiment"])
    for _ in range(2):
        assert load_checked(build, "bf16", ANCHORS, verdicts=verdicts, key=key).precision == "bf16"
    assert calls == ["fp32", "bf16", "fp32", "bf16"]
    assert blocker.read_text() == "a file where the folder would be"


def test_a_kept_pass_still_gives_an_encoder_its_fp32_twin_for_fixed_texts(tmp_path):
    from types import SimpleNamespace

    verdicts = accuracy.Verdicts(tmp_path)
    verdicts.put("k", accuracy.Verdict(True, {"cosine_min": 0.9999}, []))

    def build(precision):  # an Encoder's shape: it has a fixed_encoder
        return SimpleNamespace(precision=precision, fixed_encoder=None)

    model = load_checked(build, "bf16", ANCHORS, verdicts=verdicts, key="k")
    assert model.precision == "bf16" and model.fixed_encoder.precision == "fp32"
    # Without a key nothing is read or kept: the caller did not say what the verdict is of.
    assert accuracy.Verdicts(tmp_path / "none").get("") is None
