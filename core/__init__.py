"""The ground floor: what every room of the server stands on, in five rooms of its own.

- `config`: the settings read from the environment, and process start-up.
- `queueing`: the Celery app, its queues and messages, the broker's depths, alerts.
- `store`: the structures kept in Redis (the connection, the result cache, usage, the
  interactive protocol, the fleet's marks).
- `obs`: metrics, traces and log redaction.
- `util`: pure helpers (failure isolation, safe file access, JSON encoding, prices,
  webhooks, injected faults).

`core.vocab` holds the names every room shares. Nothing here imports a room above it.
"""
