"""Reliability declared on every task, and the limits that must hold between them."""

import pytest

from core.config.settings import Settings
from core.queueing.celery_app import (
    TRANSIENT_ERRORS,
    celery_config,
    chunk_time_limits,
    visibility_timeout,
)
from tasks import app

app.loader.import_default_modules()  # the task modules a worker imports (`include`)
LANEWAY_TASKS = sorted(name for name in app.tasks if name.startswith("laneway."))


def test_every_laneway_task_is_registered():
    assert {
        "laneway.run_chunk",
        "laneway.prep_chunk",
        "laneway.model_chunk",
        "laneway.post_chunk",
        "laneway.aggregate_job",
        "laneway.reconcile",
        "laneway.send_alert",
        "laneway.scan_inbox",
        "laneway.write_outbox",
        "laneway.notify_webhook",
    } <= set(LANEWAY_TASKS)


def test_maintenance_tasks_never_wait_behind_chunks():
    routes = celery_config(Settings.from_env({}))["task_routes"]
    for name in ("laneway.aggregate_job", "laneway.reconcile", "laneway.send_alert"):
        assert routes[name] == {"queue": "maintenance"}


# Interactive requests are acknowledged on receipt and never retried: a request whose
# worker died is the web app's to store as a job at its timeout (a redelivery would compute
# what nobody waits for any more).
ACKED_ON_RECEIPT = {"laneway.interactive"}


def test_interactive_requests_are_acknowledged_on_receipt():
    task = app.tasks["laneway.interactive"]
    assert not task.acks_late and task.ignore_result
    assert not getattr(task, "autoretry_for", ())


@pytest.mark.parametrize("name", sorted(set(LANEWAY_TASKS) - ACKED_ON_RECEIPT))
def test_tasks_ack_late_requeue_on_worker_loss_and_retry_transient_errors(name):
    task = app.tasks[name]
    assert task.acks_late and task.reject_on_worker_lost
    # Every task retries transient errors; the webhook notice also retries a webhook's own.
    assert set(TRANSIENT_ERRORS) <= set(task.autoretry_for)
    assert task.retry_backoff and task.retry_jitter and task.max_retries >= 3


@pytest.mark.parametrize("timeout", [5, 30, 600, 7200])
def test_soft_limit_comes_before_the_hard_limit(timeout):
    limits = chunk_time_limits(timeout)
    assert limits["time_limit"] == timeout
    assert 0 < limits["soft_time_limit"] < timeout


@pytest.mark.parametrize("timeout", ["30", "600", "7200"])
def test_visibility_timeout_outlasts_a_waiting_and_a_running_chunk(timeout):
    settings = Settings.from_env({"LANEWAY_CHUNK_TIMEOUT": timeout})
    visibility = celery_config(settings)["broker_transport_options"]["visibility_timeout"]
    assert visibility == visibility_timeout(int(timeout)) > 2 * int(timeout)
    assert celery_config(settings)["worker_prefetch_multiplier"] == 1


class FakeChunk:  # the attributes a signature needs, no database
    def __init__(self, stage: str) -> None:
        self.id, self.task_id, self.stage = 7, "t-7", stage


def test_dispatched_chunks_carry_their_lanes_time_limits():
    from core.queueing.dispatch import chunk_signature, chunk_task_ids

    settings = Settings.from_env({"LANEWAY_CHUNK_TIMEOUT": "30", "LANEWAY_CHUNK_TIMEOUT_GPU": "90"})
    cpu = chunk_signature(FakeChunk("run"), "cpu", settings)
    assert cpu.options["time_limit"] == 30 and cpu.options["soft_time_limit"] == 27
    assert cpu.options["queue"] == "cpu" and cpu.options["task_id"] == "t-7"
    prep, model, post = chunk_signature(FakeChunk("prep"), "gpu", settings).tasks
    assert [s.options["queue"] for s in (prep, model, post)] == ["cpu", "gpu", "cpu"]
    assert all(s.options["time_limit"] == 90 for s in (prep, model, post))
    assert [s.options["task_id"] for s in (prep, model, post)] == chunk_task_ids("t-7", "gpu")
    assert model.options["task_id"] == "t-7"
    # The visibility timeout outlasts the longest lane.
    assert celery_config(settings)["broker_transport_options"]["visibility_timeout"] > 180


def test_a_gpu_chunk_is_sent_again_from_the_stage_it_reached():
    from core.queueing.dispatch import chunk_signature

    settings = Settings.from_env({})
    assert chunk_signature(FakeChunk("post"), "gpu", settings).task == "laneway.post_chunk"
    model, post = chunk_signature(FakeChunk("model"), "gpu", settings).tasks
    assert (model.task, post.task) == ("laneway.model_chunk", "laneway.post_chunk")
