"""Celery wiring: the one app factory, queues and routes, sending chunks, the broker's depths,
the result backend and alerts."""
