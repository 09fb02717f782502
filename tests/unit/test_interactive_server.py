"""How many batches the interactive worker runs side by side, and on how many torch
threads each."""

from __future__ import annotations

import pytest

from laneway.settings import Settings
from workers.interactive_server import InteractiveServer


@pytest.mark.parametrize(
    ("device", "cores", "setting", "expected"),
    [
        ("cpu", 2, None, (2, 1)),  # one batch per core, a torch thread each
        ("cpu", 8, None, (8, 1)),
        ("cpu", 2, 1, (1, 2)),  # one batch on both cores, as before
        ("cpu", 8, 3, (3, 2)),  # the cores shared out, none over-subscribed
        ("cpu", 2, 4, (4, 1)),  # more batches than cores: a thread each still
        ("cuda", 8, None, (1, 8)),  # a GPU runs one batch at a time
        ("cuda", 8, 2, (2, 4)),
    ],
)
def test_model_threads(device, cores, setting, expected):
    settings = Settings.from_env({}).replace(torch_threads=cores, interactive_model_threads=setting)
    server = InteractiveServer(settings)
    server._lane_device = ("interactive.cpu", device)
    assert server.model_threads() == expected
