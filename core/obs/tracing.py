"""OpenTelemetry traces, on only when the standard OTEL_* variables name an exporter.

Off (the default) it costs nothing: Laneway imports neither the SDK nor an instrumentation
package (redis-py imports the metrics SDK of its own accord when installed: the packages are
the `otel` extra), and every helper here returns at once. On, each process (a gunicorn worker, a
Celery pool child, an interactive worker) sets up its own TracerProvider and batch exporter
after the fork (an exporter thread does not survive one), and the Flask and Celery
instrumentation packages (opentelemetry-python-contrib) trace requests and tasks; the
Celery one carries the W3C context in each task message's headers, chords and chains
included. The interactive path batches many requests in one model thread, so each request
carries its own context (`carrier()`) and the batch span links to all of them.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from core.util import process

log = logging.getLogger(__name__)
TRACER = "laneway"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
# The stages of a chunk (inference/pipeline.py StageTimes), in the order they run.
STAGES = ("pre", "model", "post")
# What the `otel` extra installs (pyproject.toml), as the modules this file imports.
PACKAGES = (
    "opentelemetry.sdk.trace",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.instrumentation.flask",
    "opentelemetry.instrumentation.celery",
)
# Probes and scrapes (regular expressions on the URL): not traces anyone looks for.
PROBES = "/livez$,/healthz$,/metrics$"

# The pid of the process whose provider this module set up: a forked child has none yet.
_configured_pid: int | None = None


class TracingError(ValueError):
    """The OTEL_* variables ask for something Laneway cannot export to."""


def exporter_name(env: Mapping[str, str] = os.environ) -> str | None:
    """The span exporter the environment asks for (`otlp` or `console`), or None for off:
    OTEL_TRACES_EXPORTER when set (`none` is off), else `otlp` when an OTLP endpoint is set.
    OTEL_SDK_DISABLED=true turns it off whatever else is set."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n]
    if names:
        if names == ["none"]:
            return None
        if len(names) > 1 or names[0] not in ("otlp", "otlp_proto_http", "console"):
            raise TracingError(
                f"OTEL_TRACES_EXPORTER={env['OTEL_TRACES_EXPORTER']!r}: Laneway exports "
                "spans to one of otlp, console or none"
            )
        return "console" if names[0] == "console" else "otlp"
    if any(env.get(name, "").strip() for name in ENDPOINT_VARIABLES):
        return "otlp"
    return None


def check_protocol(env: Mapping[str, str] = os.environ) -> None:
    """Laneway ships the OTLP/HTTP protobuf exporter (the OTLP default): a collector's
    4318 port. A gRPC protocol is refused at start-up rather than silently not exported."""
    for name in PROTOCOL_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            if value != "http/protobuf":
                raise TracingError(
                    f"{name}={value!r}: Laneway exports OTLP over http/protobuf (a collector's "
                    "port 4318); set it to http/protobuf or leave it unset"
                )
            return


def check(env: Mapping[str, str] = os.environ) -> str | None:
    """The exporter to set up (None: off), once the settings and the installed packages
    allow it; TracingError, naming the fix, when they do not."""
    name = exporter_name(env)
    if name is None:
        return None
    check_protocol(env)
    missing = [module for module in PACKAGES if not _importable(module)]
    if missing:
        raise TracingError(
            f"the OTEL_* variables ask for traces but {', '.join(missing)} is not installed: "
            "pip install 'laneway[otel]'"
        )
    return name


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def enabled() -> bool:
    """True in a process whose tracing is set up (not merely inherited through a fork)."""
    return _configured_pid == process.pid()  # asked on every interactive request


def configure(service: str, env: Mapping[str, str] = os.environ) -> bool:
    """Set up this process's tracer provider and the Celery instrumentation when the
    environment names an exporter; idempotent per process. OTEL_SERVICE_NAME (or
    service.name in OTEL_RESOURCE_ATTRIBUTES) overrides `service`."""
    global _configured_pid
    if enabled():
        return True
    name = check(env)
    if name is None:
        return False
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        # A provider inherited through a fork is kept: the SDK restarts its exporter
        # thread in the child (and the API allows one global provider per process).
        resource = Resource.create()
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: service}))
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
        trace.set_tracer_provider(provider)
    instrumentor = CeleryInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()
    _configured_pid = process.pid()
    log.info("tracing: %s spans of %s", name, _service_of(trace.get_tracer_provider()))
    return True


def flush(timeout_ms: int = 5000) -> None:
    """Export the spans still buffered: a pool process may exit without the SDK's atexit."""
    if not enabled():
        return
    from opentelemetry import trace

    trace.get_tracer_provider().force_flush(timeout_ms)


def _service_of(provider: Any) -> str:
    return str(provider.resource.attributes.get("service.name"))


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    # Reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, _TIMEOUT, _COMPRESSION itself.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def instrument_flask(app: Any) -> None:
    """Trace the app's requests (a span per request, named by its route)."""
    if not enabled():
        return
    from opentelemetry.instrumentation.flask import FlaskInstrumentor

    FlaskInstrumentor().instrument_app(app, excluded_urls=PROBES)


def worker_service(queues: Sequence[str] | None) -> str:
    """A worker's service name: `laneway-worker-<queue>` for the lane it serves."""
    # Not its own direct queue (`<node>@<host>.dq` or `.dq2`), nor the maintenance queue.
    served = [q for q in queues or () if "@" not in q]
    lanes = [q for q in served if q != "maintenance"] or served or ["celery"]
    return f"laneway-worker-{lanes[0]}"


def record_stages(seconds: Mapping[str, float]) -> None:
    """Child spans of the current span, one per stage with its measured seconds (the
    `laneway.seconds` attribute), laid end to end and ending now: a cpu-lane chunk runs
    its stages per micro-batch, so the spans show each stage's total, not its clock."""
    if not enabled():
        return
    from opentelemetry import trace

    tracer = trace.get_tracer(TRACER)
    stages = [(s, max(0.0, float(seconds[s]))) for s in STAGES if s in seconds]
    start = time.time_ns() - int(sum(v for _, v in stages) * 1e9)
    for stage, value in stages:
        end = start + int(value * 1e9)
        span = tracer.start_span(stage, start_time=start)
        span.set_attribute("laneway.stage", stage)
        span.set_attribute("laneway.seconds", value)
        span.end(end_time=end)
        start = end


def set_attributes(**attributes: Any) -> None:
    """Attributes on the current span (`laneway.<name>`), e.g. the job and chunk ids."""
    if not enabled():
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(f"laneway.{key}", value if isinstance(value, int) else str(value))


def carrier() -> dict[str, str] | None:
    """The current span's context as W3C headers (`traceparent`, `tracestate`), for a
    message that the Celery instrumentation does not carry per request; None when off."""
    if not enabled():
        return None
    from opentelemetry.propagate import inject

    headers: dict[str, str] = {}
    inject(headers)
    return headers or None


@contextmanager
def _linked_span(
    name: str, carriers: Sequence[Mapping[str, str] | None], **attributes: Any
) -> Iterator[Any]:
    from opentelemetry import trace

    links = []
    for headers in carriers:
        context = _span_context(headers)
        if context is not None:
            links.append(trace.Link(context))
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(name, links=links, attributes=attributes) as span:
        yield span


def _span_context(headers: Any) -> Any:
    """The valid span context in W3C headers, or None (absent or malformed: ignored)."""
    if not isinstance(headers, Mapping) or not headers:
        return None
    from opentelemetry import trace
    from opentelemetry.propagate import extract

    carried = {k: v for k, v in headers.items() if isinstance(k, str) and isinstance(v, str)}
    context = trace.get_current_span(extract(carried)).get_span_context()
    return context if context.is_valid else None


def record_span(name: str, parent: Any, started: float, **attributes: Any) -> None:
    """A finished span from `started` (time.time()) to now, a child of the span context in
    the W3C headers `parent` (ignored when absent or malformed)."""
    if not enabled():
        return
    from opentelemetry import trace

    context = _span_context(parent)
    parent_context = trace.set_span_in_context(trace.NonRecordingSpan(context)) if context else None
    tracer = trace.get_tracer(TRACER)
    span = tracer.start_span(
        name, context=parent_context, start_time=int(started * 1e9), attributes=attributes
    )
    span.end()


def linked_span(
    name: str, carriers: Sequence[Mapping[str, str] | None], **attributes: Any
) -> AbstractContextManager[Any]:
    """A span (a new trace) linked to the span context in each carrier: an interactive
    batch, linked to every request it served. A no-op context when tracing is off."""
    if not enabled():
        return nullcontext()
    return _linked_span(name, carriers, **attributes)
