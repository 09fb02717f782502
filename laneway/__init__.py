"""Laneway: a Celery worker fleet for NLP inference."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laneway.client import Backoff, Client, LanewayError

__version__ = "0.1.0"
__all__ = ["Backoff", "Client", "LanewayError"]


def __getattr__(name: str) -> Any:
    # Imported on first use: workers import `laneway` and need no HTTP client.
    if name in __all__:
        from laneway import client

        return getattr(client, name)
    raise AttributeError(f"module 'laneway' has no attribute {name!r}")
