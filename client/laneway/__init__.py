"""The Python client of Laneway's HTTP API; it needs httpx and nothing of the server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laneway.async_client import AsyncClient
    from laneway.client import Client
    from laneway.errors import LanewayConnectionError, LanewayError
    from laneway.retry import Backoff, Retry
    from laneway.types import Job, JobList, Progress, Result

__version__ = "0.2.0"
# Where each public name lives; imported on first use, so `import laneway` stays cheap
# for a caller that only reads the version (the CLI's --version).
_HOMES = {
    "AsyncClient": "async_client",
    "Client": "client",
    "LanewayError": "errors",
    "LanewayConnectionError": "errors",
    "Backoff": "retry",
    "Retry": "retry",
    "Job": "types",
    "JobList": "types",
    "Progress": "types",
    "Result": "types",
}
__all__ = [
    "AsyncClient",
    "Backoff",
    "Client",
    "Job",
    "JobList",
    "LanewayConnectionError",
    "LanewayError",
    "Progress",
    "Result",
    "Retry",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        from importlib import import_module

        return getattr(import_module(f"laneway.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'laneway' has no attribute {name!r}")
