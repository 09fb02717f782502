"""Observability: Prometheus metrics, OpenTelemetry traces, log redaction."""
