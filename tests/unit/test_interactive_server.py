"""How many batches the interactive worker runs side by side, and on how many torch
threads each."""

from __future__ import annotations

import pytest

from core.config.settings import Settings
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


@pytest.mark.parametrize(
    ("device", "cores", "setting", "precision", "expected"),
    [
        ("cpu", 2, None, "fp32", 2),  # a lone batch on every core
        ("cpu", 2, None, "fp16", 2),
        ("cpu", 8, 3, "fp32", 8),
        ("cpu", 2, None, "bf16", 1),  # oneDNN's bf16 products: its own core's share
        ("cpu", 2, 1, "fp32", 2),
        ("cuda", 8, None, "auto", 8),  # one batch at a time already has them all
    ],
)
def test_a_lone_batch_takes_every_core_where_the_products_read_weights(
    monkeypatch, device, cores, setting, precision, expected
):
    from inference import halfweights
    from inference import precision as prec

    monkeypatch.setattr(prec, "native_bf16_cpu", lambda: True)  # bf16 stays bf16
    monkeypatch.setattr(halfweights, "available", lambda: True)
    settings = Settings.from_env({}).replace(
        torch_threads=cores, interactive_model_threads=setting, precision=precision
    )
    server = InteractiveServer(settings)
    server._lane_device = ("interactive.cpu", device)
    assert server.lone_threads() == expected
