"""A worker's own /metrics: the metrics folder of its host, served from a thread of the
worker's main process, for hosts where no web app reads that folder (a Kubernetes pod,
whose folder is an emptyDir of its own).

A thread rather than a sidecar container: the pod runs one image and one process tree,
and the worker's lifetime is the scrape target's. The socket is bound with SO_REUSEPORT,
so that every worker process of one pod (`laneway worker gpu` runs one per device) binds
the same port: each serves the whole folder, and a worker stopped by the scale-down leaves
the others serving. prometheus_client's WSGI app and threading server do the HTTP.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

from core.obs.metrics import CollectorRegistry, CompactingCollector


class _SharedPortServer(ThreadingWSGIServer):
    """Binds a port that the pod's other worker processes may bind too."""

    daemon_threads = True

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


class _QuietHandler(WSGIRequestHandler):
    """No line per scrape in the worker's log."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def serve_folder(path: Path, host: str, port: int) -> WSGIServer:
    """Serve the folder's metrics on host:port from a daemon thread; returns the server
    (its `shutdown()` stops it). Raises OSError when the port cannot be bound."""
    registry = CollectorRegistry()
    CompactingCollector(registry, path=str(path))
    server = make_server(
        host, port, make_wsgi_app(registry), _SharedPortServer, handler_class=_QuietHandler
    )
    threading.Thread(target=server.serve_forever, name="laneway-metrics", daemon=True).start()
    return server
