"""Tracing (core/obs/tracing.py): which OTEL_* settings turn it on, that off it imports and
sets up nothing, and, on, the spans it makes (a console exporter in a child process, so
this process's tracer provider stays unset)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from core.obs import tracing
from core.store.interactive_protocol import Request, new_request
from core.util import process

ENDPOINT = "http://collector:4318"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT + "/v1/traces"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, None),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),  # the default endpoint, localhost:4318
        ({"OTEL_TRACES_EXPORTER": "otlp_proto_http"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": " Console "}, "console"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, None),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, "otlp"),
        # Metrics or logs exporters alone do not turn traces on.
        ({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_LOGS_EXPORTER": "otlp"}, None),
    ],
)
def test_an_exporter_is_named_only_by_the_standard_variables(env, expected):
    assert tracing.exporter_name(env) == expected


@pytest.mark.parametrize("value", ["jaeger", "zipkin", "otlp,console", "otlp_proto_grpc"])
def test_an_exporter_laneway_lacks_is_refused_by_name(value):
    with pytest.raises(tracing.TracingError, match="OTEL_TRACES_EXPORTER"):
        tracing.exporter_name({"OTEL_TRACES_EXPORTER": value})


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
        # The traces variable wins over the general one, both ways.
        {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        },
    ],
)
def test_a_protocol_other_than_http_protobuf_is_refused(env):
    with pytest.raises(tracing.TracingError, match="http/protobuf"):
        tracing.check_protocol(env)


def test_http_protobuf_or_no_protocol_is_accepted():
    tracing.check_protocol({})
    tracing.check_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    tracing.check_protocol(
        {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        }
    )


@pytest.mark.parametrize(
    ("queues", "service"),
    [
        (["cpu", "cpu@vm.dq2", "maintenance"], "laneway-worker-cpu"),
        (["interactive.cpu", "interactive@vm.dq2"], "laneway-worker-interactive.cpu"),
        (["gpu", "gpu0@vm.dq"], "laneway-worker-gpu"),
        (["maintenance", "maintenance@vm.dq2"], "laneway-worker-maintenance"),
        (None, "laneway-worker-celery"),
    ],
)
def test_a_worker_is_named_for_the_lane_it_serves(queues, service):
    assert tracing.worker_service(queues) == service


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {**env, **extra}


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-c", code], env=_child_env(**env), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


OFF = """
import json, sys
from flask import Flask
from webapp import create_app
import tasks.app
from core.store import interactive_protocol as interactive
from core.obs import tracing

app = create_app()
request = interactive.new_request(["embed"], [], [("1", "a text")], keep=False, account=1)
tracing.record_stages({"pre": 0.1, "model": 0.2, "post": 0.3})
tracing.set_attributes(job="j")
tracing.record_span("x", {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, 0.0)
with tracing.linked_span("batch", [None]) as span:
    pass
tracing.flush()
provider = None
if "opentelemetry.trace" in sys.modules:  # redis-py imports the API (its own metrics)
    provider = sys.modules["opentelemetry.trace"]._TRACER_PROVIDER
print(json.dumps({
    "modules": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
    "provider": repr(provider) if provider is not None else None,
    # Beneath the fast path (webapp/fastpath.py), Flask's own WSGI callable.
    "wrapped": app.wsgi_app.inner.__func__ is not Flask.wsgi_app,
    "message": request.message(),
    "carrier": tracing.carrier(),
    "span": span,
    "enabled": tracing.enabled(),
}))
"""
# What Laneway's tracing would import; redis-py imports the API and the metrics SDK on its
# own whenever they are installed (the reason they are an extra).
TRACING_MODULES = (
    "opentelemetry.sdk.trace",
    "opentelemetry.exporter",
    "opentelemetry.instrumentation",
    "opentelemetry.propagate",
)


@pytest.mark.slow
def test_unset_it_imports_and_sets_up_nothing_and_every_helper_is_a_no_op():
    out = json.loads(_run(OFF).stdout.splitlines()[-1])
    assert not [m for m in out["modules"] if m.startswith(TRACING_MODULES)], out["modules"]
    # No tracer provider, no Flask middleware (and no Celery signal receivers: the
    # instrumentation was never imported).
    assert out["provider"] is None and out["wrapped"] is False
    assert out["enabled"] is False and out["carrier"] is None and out["span"] is None
    # The interactive message is what a worker without tracing reads: no `trace` field.
    assert "trace" not in out["message"]


def test_asked_for_without_the_packages_it_names_the_extra(monkeypatch):
    monkeypatch.setattr(tracing, "PACKAGES", ("opentelemetry.sdk.trace", "no_such_pkg.sub"))
    with pytest.raises(tracing.TracingError, match=r"no_such_pkg.sub .*laneway\[otel\]"):
        tracing.check({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT})
    assert tracing.check({}) is None  # unset: nothing is looked for


ON = """
import json, sys
from opentelemetry import trace
from core.store import interactive_protocol as interactive
from core.obs import tracing

assert tracing.configure("laneway-test") and tracing.configure("laneway-test")
tracer = trace.get_tracer("test")
with tracer.start_as_current_span("parent") as parent:
    tracing.set_attributes(job="j1", chunk=7, missing=None)
    tracing.record_stages({"model": 0.25, "pre": 0.5, "post": -1.0})
    request = interactive.new_request(["embed"], [], [("1", "a")], keep=False, account=1)
message = request.message()
bad = [None, {}, "not a mapping", {"traceparent": 5}, {"traceparent": "00-garbage"},
       {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"}, {1: 2}]
with tracing.linked_span("interactive.batch", [message["trace"], *bad], **{"laneway.n": 2}):
    pass
tracing.record_span("interactive.request", message["trace"], 0.0)
tracing.record_span("orphan", "not a mapping", 0.0)
tracing.flush()
print("MESSAGE " + json.dumps(message))
"""


def _spans(stdout: str) -> list[dict]:
    """The console exporter's spans: JSON objects one after another."""
    decoder, spans, text = json.JSONDecoder(), [], stdout.split("MESSAGE ")[0].strip()
    while text:
        span, end = decoder.raw_decode(text)
        spans.append(span)
        text = text[end:].strip()
    return spans


@pytest.mark.slow
def test_on_it_makes_stage_spans_links_and_carries_the_context():
    done = _run(ON, OTEL_TRACES_EXPORTER="console")
    spans = {s["name"]: s for s in _spans(done.stdout)}
    message = json.loads(done.stdout.split("MESSAGE ")[1])
    parent = spans["parent"]
    assert parent["attributes"] == {"laneway.job": "j1", "laneway.chunk": 7}
    assert parent["resource"]["attributes"]["service.name"] == "laneway-test"
    # Stages in pipeline order, children of the current span, with their seconds (a
    # negative figure is clamped to zero), laid end to end.
    stages = [spans[s] for s in ("pre", "model", "post")]
    assert all(s["parent_id"] == parent["context"]["span_id"] for s in stages)
    assert [s["attributes"]["laneway.seconds"] for s in stages] == [0.5, 0.25, 0.0]
    assert stages[0]["end_time"] == stages[1]["start_time"]
    # The request carries the parent's context; the batch links to it alone (every
    # malformed or absent carrier is ignored), and the request's worker span is its child.
    trace_id = parent["context"]["trace_id"].removeprefix("0x")
    span_id = parent["context"]["span_id"].removeprefix("0x")
    assert message["trace"]["traceparent"].startswith(f"00-{trace_id}-{span_id}-")
    batch = spans["interactive.batch"]
    assert [link["context"]["span_id"] for link in batch["links"]] == [parent["context"]["span_id"]]
    assert batch["parent_id"] is None and batch["attributes"] == {"laneway.n": 2}
    assert spans["interactive.request"]["parent_id"] == parent["context"]["span_id"]
    assert spans["orphan"]["parent_id"] is None
    # A worker of the same code reads the message back.
    assert Request.from_message(message).trace == message["trace"]


@pytest.mark.slow
def test_the_service_name_variable_wins():
    done = _run(ON, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="my-laneway")
    names = {s["resource"]["attributes"]["service.name"] for s in _spans(done.stdout)}
    assert names == {"my-laneway"}


def test_a_request_made_while_off_has_no_trace():
    request = new_request(["embed"], [], [("1", "a")], keep=True, account=3)
    assert request.trace is None and "trace" not in request.message()
    assert Request.from_message(request.message()) == request


@pytest.mark.slow  # forks a process
def test_a_forked_child_is_not_set_up_by_its_parents_tracing(monkeypatch):
    """`enabled` holds in the process that set tracing up, not in a child forked from it
    (a gunicorn or Celery worker sets up its own)."""
    monkeypatch.setattr(tracing, "_configured_pid", process.pid())  # as `configure` leaves it
    assert tracing.enabled()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its answer, then out at once
        os.write(write, b"1" if tracing.enabled() else b"0")
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"0"
    os.close(read)
    assert tracing.enabled()
