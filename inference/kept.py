"""Files a worker keeps between its starts, under LANEWAY_MODEL_CACHE_DIR (default
LANEWAY_HOME): the precision check's verdicts (inference/accuracy.py) and the interactive
worker's ONNX exports (inference/lone.py). Each is named by a hash of everything it depends
on, so that a changed model file, library or setting finds no file and the work is done
again; one that cannot be read, or a folder that cannot be written, only means doing the
work every time."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


def files_identity(path: str) -> list[list[Any]]:
    """Each file under a model's folder (a file itself when it is one): its name, size
    and modification time, enough to see weights replaced in place."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    out = []
    for file in files:
        stat = file.stat()
        out.append([str(file.relative_to(root)) if root.is_dir() else file.name,
                    stat.st_size, stat.st_mtime_ns])  # fmt: skip
    return out


def model_key(model_path: str, **inputs: Any) -> str:
    """A hash of the model's files and folder, the torch and transformers versions, and
    `inputs` (what else the kept file depends on)."""
    import transformers

    named = {
        "files": files_identity(model_path),
        "model": str(Path(model_path).resolve()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        **inputs,
    }
    blob = json.dumps(named, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


class KeptFiles:
    """One file per key in `folder`, named `<key><suffix>`."""

    suffix = ""
    what = "file"

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}{self.suffix}"

    def read(self, key: str) -> bytes | None:
        try:
            return self.path(key).read_bytes()
        except OSError:
            return None  # none kept, or unreadable: the work is done again

    def write(self, key: str, data: bytes) -> None:
        """Written whole or not at all (a temporary file of a name of its own, renamed), so
        that two workers starting together, on one host or on two sharing the folder (pods,
        whose process ids repeat), never read half of one."""
        path = self.path(key)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        except OSError as error:
            log.debug("%s not kept in %s: %s", self.what, self.folder, error)
