"""The injected faults: each acts only on its marker, and only when it is on."""

import threading
import time

import pytest

from core.config.settings import Settings
from core.util.faults import PoisonError, model_stage_check, stall_file
from core.vocab import POISON_MARKER, STALL_MARKER


def settings_with(tmp_path, faults: str) -> Settings:
    return Settings.from_env({"LANEWAY_HOME": str(tmp_path), "LANEWAY_FAULTS": faults})


def test_no_faults_no_hook(tmp_path):
    assert model_stage_check(settings_with(tmp_path, "")) is None


def test_poison_raises_on_its_marker_only(tmp_path):
    check = model_stage_check(settings_with(tmp_path, "poison"))
    check(["fine", f"a {STALL_MARKER} text"])
    with pytest.raises(PoisonError):
        check(["fine", f"a {POISON_MARKER} text"])


def test_stall_holds_a_marked_chunk_while_its_file_exists(tmp_path):
    settings = settings_with(tmp_path, "poison,stall")
    check = model_stage_check(settings)
    path = stall_file(settings)
    path.touch()
    started = time.monotonic()
    check(["an unmarked chunk passes at once"])
    assert time.monotonic() - started < 0.5
    threading.Timer(0.5, path.unlink).start()
    check(["x", f"a {STALL_MARKER} text"])  # returns once the file is gone
    assert time.monotonic() - started >= 0.5
    check([f"a {STALL_MARKER} text"])  # no file: no stall
