"""The Python client of Laneway's HTTP API; it needs httpx and nothing of the server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laneway.client import Backoff, Client, LanewayError

__version__ = "0.2.0"
__all__ = ["Backoff", "Client", "LanewayError"]


def __getattr__(name: str) -> Any:
    # Imported on first use: `import laneway` stays cheap for a caller that only reads the version.
    if name in __all__:
        from laneway import client

        return getattr(client, name)
    raise AttributeError(f"module 'laneway' has no attribute {name!r}")
