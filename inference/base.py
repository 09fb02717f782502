"""What every local transformers model shares: device, tokenizer, dtype, the CPU stage."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

# Nothing may reach a model hub at run time; set before transformers is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from inference import halfweights  # noqa: E402
from inference.batching import Prepared, prepare, run_batches  # noqa: E402
from inference.precision import DTYPES, runtime_label  # noqa: E402
from inference.tokenize import Direct  # noqa: E402

hf_logging.disable_progress_bar()


class LocalModel:
    """A model directory loaded with its tokenizer onto one device, in eval mode."""

    auto_class: ClassVar[Any]
    offsets: ClassVar[bool] = False  # token character offsets, for span tasks

    def __init__(
        self,
        path: str,
        device: str = "cpu",
        max_length: int = 256,
        batch_size: int = 32,
        precision: str = "fp32",
    ) -> None:
        """`precision` is loaded as given (fp32, bf16, fp16): workers choose and check it
        first (inference/precision.py)."""
        self.device = torch.device(device)
        self.precision = precision
        self.runtime = runtime_label(precision, self.device.type)
        self.max_length = max_length
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        # A fast tokenizer sets its truncation and padding on each call: threads that run
        # batches side by side (the interactive worker's) take turns ("Already borrowed").
        # The direct path's copy is never changed after it is built: no turns.
        self._tokenizing = threading.Lock()
        self.direct = None if self.offsets else Direct.build(self.tokenizer, max_length)
        if self.offsets and not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(f"{path}: a fast tokenizer is required (character offsets)")
        # bf16 on a CPU: the matrix products' weights in bf16 under autocast, the rest
        # (embeddings, LayerNorm, the residual stream) in fp32: nearly bf16 throughout's
        # speed (the products are the work) at a fraction of its error.
        self.mixed = precision == "bf16" and self.device.type == "cpu"
        # fp16 on a CPU: fp32 weights and arithmetic, the products' weights read from an
        # fp16 copy where that is faster (inference/halfweights.py).
        self.half_weights = precision == "fp16" and self.device.type == "cpu"
        on_cpu_fp32 = self.mixed or self.half_weights
        dtype = torch.float32 if on_cpu_fp32 else DTYPES[precision]
        model = self.auto_class.from_pretrained(path, dtype=dtype)
        if self.mixed:
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.to(torch.bfloat16)
        if self.half_weights:
            halfweights.convert(model)
        self.model = model.to(self.device).eval()

    def run(self, prepared: Prepared, forward: Callable[[dict], torch.Tensor]) -> list:
        """`forward` over each micro-batch on the device, under autocast where mixed."""
        mixed = torch.autocast("cpu", dtype=torch.bfloat16) if self.mixed else None
        with mixed or contextlib.nullcontext():
            return run_batches(prepared, forward, self.device)

    def prepare(self, texts: Sequence[str], batch_size: int | None = None) -> Prepared:
        """CPU stage: tokenize into length-sorted micro-batches."""
        size = batch_size or self.batch_size
        if self.direct is not None:
            return prepare(self.tokenizer, texts, self.max_length, size, direct=self.direct)
        with self._tokenizing:
            return prepare(self.tokenizer, texts, self.max_length, size, offsets=self.offsets)


def config_labels(config: Any, labels: Sequence[str] | None = None) -> list[str]:
    """The given labels, else the config's id2label in id order; either must cover num_labels."""
    num_labels = int(config.num_labels)
    if labels is not None:
        names = [str(x) for x in labels]
        source = "the given labels"
    else:
        id2label = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
        names = [id2label[i] for i in sorted(id2label)]
        source = "the model config's id2label"
        if sorted(id2label) != list(range(len(id2label))):
            raise ValueError(
                f"{source} has ids {sorted(id2label)}; expected 0..{num_labels - 1} without gaps"
            )
    if len(names) != num_labels:
        raise ValueError(
            f"{source}: {len(names)} labels, but the model has num_labels={num_labels}"
        )
    return names


class LabeledModel(LocalModel):
    """A classification head: its labels come from the registry or the config's id2label."""

    def __init__(self, *args: Any, labels: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.labels = config_labels(self.model.config, labels)
        self.num_labels = len(self.labels)
