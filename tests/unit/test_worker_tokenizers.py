"""Which workers tokenize on their calling thread alone (workers/signals.py)."""

from __future__ import annotations

import pytest

from workers.signals import serial_tokenizers


@pytest.mark.parametrize(
    "queues",
    [["interactive.cpu", "n1.dq"], ["interactive.gpu"], ["interactive.cpu", "interactive.gpu"]],
)
def test_an_interactive_worker_tokenizes_on_its_model_thread(queues: list[str]) -> None:
    environ: dict[str, str] = {}
    serial_tokenizers(queues, environ)
    assert environ == {"TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.parametrize("queues", [["cpu"], ["gpu", "n1.dq"], ["cpu", "interactive.cpu"], []])
def test_a_batch_worker_keeps_the_tokenizer_pool(queues: list[str]) -> None:
    environ: dict[str, str] = {}
    serial_tokenizers(queues, environ)
    assert environ == {}


def test_the_operators_own_setting_wins() -> None:
    environ = {"TOKENIZERS_PARALLELISM": "true"}
    serial_tokenizers(["interactive.cpu"], environ)
    assert environ == {"TOKENIZERS_PARALLELISM": "true"}
