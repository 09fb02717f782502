"""One text alone on every core: ONNX Runtime's forward, for the interactive lane.

A demo's request is one text, and an interactive worker with nothing else to do gives its
forward every core (workers/interactive_server.py). There torch runs one short operation
after another, each parallelised anew, while ONNX Runtime runs the same graph with its
attention, LayerNorm, GELU and bias additions fused and its own GEMM (MLAS), so on a CPU
without native bf16 it runs one text faster than the packed forward with fp16 weights
(inference/packed.py), with the same vectors to within rounding. Batches of several texts
stay with torch: its packed forward skips their padding, which ONNX Runtime computes.
`bench/calibrate.py lone` re-derives the choice on a machine.

`OnnxSingleText.build` exports the loaded model's encoder with its mean pooling (fp32,
through torch.onnx's TorchScript exporter, into memory: seconds of a worker's start) and
opens an ONNX Runtime session on `threads` threads that sleep between calls (spinning
threads would take the cores from the torch batches beside them). It checks the session
against torch's forward on texts of several lengths before it is used; anything else (no
onnxruntime, a GPU, bf16, a failed export or check) keeps torch's forward. An export that
passed is kept (`Exports`, in LANEWAY_MODEL_CACHE_DIR/onnx-exports), keyed by the model's
files and the exporter's versions, so that a worker starting again opens it instead of
exporting; a kept graph is checked as a new one is, and exported again when it does not
pass.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from inference.kept import KeptFiles, model_key

log = logging.getLogger(__name__)

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# How close the session's pooled vectors must be to torch's forward (cosine, every text of
# the check): the same fp32 arithmetic in another order agrees to about 0.9999999, fp16
# weights against fp32 ones to about 0.9999997; a wrong graph is far below.
SELF_CHECK_COSINE = 0.99999
OPSET = 17


class _Pooled(torch.nn.Module):
    """The encoder's last hidden states averaged over each text's tokens, for the export."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: ANN001, ANN201
        hidden = self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state.float()
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)


def why_not(setting: str, device: torch.device, precision: str) -> str:
    """Why one text alone keeps torch's forward ("" when ONNX Runtime may run it)."""
    if setting == "torch":
        return "LANEWAY_LONE_RUNTIME=torch"
    if device.type != "cpu":
        return f"not measured on {device.type}"
    if precision == "bf16":
        return "bf16 runs in oneDNN's products (not measured against ONNX Runtime fp32)"
    try:
        import onnx  # noqa: F401 - torch.onnx's exporter writes through it
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed"
    return ""


class OnnxSingleText:
    """An ONNX Runtime session of the encoder with its mean pooling, for a batch of one."""

    def __init__(self, session: Any, threads: int) -> None:
        self.session = session
        self.threads = threads
        self.inputs = [i.name for i in session.get_inputs()]

    @classmethod
    def build(
        cls,
        model: torch.nn.Module,
        threads: int,
        reference: Callable[[dict[str, torch.Tensor]], torch.Tensor],
        exports: Exports | None = None,
        key: str = "",
    ) -> OnnxSingleText | None:
        """The session of `model` (a loaded fp32 encoder) on `threads` threads, checked
        against `reference` (torch's mean-pooled forward), or None with the reason logged.
        With `exports` and a `key` (Exports.key), a kept graph that passes the check is
        used instead of a new export, and a new export that passes is kept."""

        def opened(graph: bytes) -> tuple[OnnxSingleText, float]:
            lone = cls(session(graph, threads), threads)
            return lone, lone.self_check(int(model.config.vocab_size), reference)

        kept = exports.read(key) if exports is not None and key else None
        if kept is not None:
            try:
                lone, agreement = opened(kept)
                if agreement >= SELF_CHECK_COSINE:
                    return lone
            except Exception as exc:  # noqa: BLE001 - a damaged file: export again
                log.info("the kept ONNX export %s failed (%s): exporting again", key[:12], exc)
        try:
            graph = export(model)
            lone, agreement = opened(graph)
        except Exception as exc:  # noqa: BLE001 - another architecture or release, say
            log.warning("one text alone keeps torch's forward: ONNX Runtime failed (%s)", exc)
            return None
        if agreement < SELF_CHECK_COSINE:
            log.warning(
                "one text alone keeps torch's forward: ONNX Runtime agreed to cosine %.7f only",
                agreement,
            )
            return None
        if exports is not None and key:
            exports.write(key, graph)
        return lone

    def mean_pooled(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """(batch, hidden) float32: each text's last hidden states averaged over its tokens."""
        ids = inputs["input_ids"]
        feed = {
            name: (inputs[name] if name in inputs else torch.zeros_like(ids)).numpy()
            for name in self.inputs
        }
        return torch.from_numpy(self.session.run(None, feed)[0])

    def self_check(
        self, vocab: int, reference: Callable[[dict[str, torch.Tensor]], torch.Tensor]
    ) -> float:
        """The lowest cosine between the session's vectors and `reference`'s, one text at a
        time: a lone token, a short text, a second segment, a long one."""
        generator = torch.Generator().manual_seed(0)
        lowest = 1.0
        for n, second in ((1, 0), (9, 0), (30, 12), (250, 0)):
            ids = torch.randint(1000, vocab, (1, n), generator=generator)
            types = torch.zeros_like(ids)
            if second:
                types[0, n - second :] = 1
            inputs = {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "token_type_ids": types,
            }
            with torch.inference_mode():
                want = reference(inputs)
            got = self.mean_pooled(inputs)
            lowest = min(lowest, F.cosine_similarity(want, got, dim=1).min().item())
        return lowest


def export(model: torch.nn.Module) -> bytes:
    """The encoder and its mean pooling as an ONNX graph (batch and length dynamic)."""
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 2023, 102, 0]])
    mask = (ids != 0).long()
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            _Pooled(model).eval(),
            (ids, mask, torch.zeros_like(ids)),
            buffer,
            input_names=list(INPUTS),
            output_names=["pooled"],
            dynamic_axes={name: {0: "batch", 1: "length"} for name in INPUTS}
            | {"pooled": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    return buffer.getvalue()


def session(graph: bytes, threads: int) -> Any:
    """An ONNX Runtime CPU session of `graph` on `threads` threads that sleep when idle."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


class Exports(KeptFiles):
    """Exported graphs, one file each in `folder` (inference/kept.py)."""

    suffix = ".onnx"
    what = "ONNX export"

    @staticmethod
    def key(model_path: str, precision: str) -> str:
        import onnx

        return model_key(
            model_path, precision=precision, onnx=onnx.__version__, opset=OPSET, inputs=INPUTS
        )
