"""Liveness checks for compose's health checks and Kubernetes' probes (`laneway probe ...`).

They run every few seconds beside the process they check, so they stay cheap: none imports
the task modules (which import torch) or loads a model. Each returns (alive, why).
"""

from __future__ import annotations

import time

from core.config.settings import Settings
from core.store.fleet_metrics import BEAT_MAX_AGE, beat_heartbeat


def beat_alive(settings: Settings, max_age: float = BEAT_MAX_AGE) -> tuple[bool, str]:
    """Whether this home's beat has ticked within `max_age` seconds."""
    path = beat_heartbeat(settings)
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return False, f"no beat heartbeat at {path}: beat has not ticked"
    if age > max_age:
        return False, f"beat last ticked {age:.0f} s ago (more than {max_age:g} s)"
    return True, f"beat ticked {age:.0f} s ago"


def node_name(name: str) -> str:
    """`cpu` is cpu@<this host>, as `-n cpu@%h` names the worker; a full node name stays."""
    from fleet.processes import node

    return name if "@" in name else node(name)


def worker_alive(settings: Settings, node: str, timeout: float) -> tuple[bool, str]:
    """Whether the worker `node` answers a ping through the broker. A bare Celery app on
    the broker's URL sends it: Laneway's app would import every task module, and torch."""
    from celery import Celery

    app = Celery("laneway-probe", broker=settings.redis_url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = False
    app.conf.broker_connection_max_retries = 1
    try:
        replies = app.control.ping(destination=[node], timeout=timeout, limit=1)
    except Exception as exc:  # noqa: BLE001 - any failure to ask means not known alive
        return False, f"could not ask {node}: {type(exc).__name__}: {exc}"
    finally:
        app.close()
    if any(node in reply for reply in replies):
        return True, f"{node} answered"
    return False, f"{node} did not answer within {timeout:g} s"


def http_alive(url: str, timeout: float) -> tuple[bool, str]:
    """Whether `url` answers 200."""
    import httpx

    try:
        status = httpx.get(url, timeout=timeout).status_code
    except httpx.HTTPError as exc:
        return False, f"{url}: {type(exc).__name__}"
    return status == 200, f"{url}: {status}"
