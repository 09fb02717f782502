"""Prometheus metrics shared by every Laneway process on a machine.

prometheus_client's multiprocess mode: each process (web workers, celery worker children,
beat) writes its counters and histograms to its own memory-mapped file under
LANEWAY_HOME/metrics, and the web app's /metrics adds them up at scrape time, so no process
runs a metrics server of its own. The queues' depth is read from the broker at scrape time.
Files of processes that have died are folded into one archive file per metric type (their
counts stay; the folder does not grow with every restart).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.config.settings import Settings, get_settings
from core.util import process
from core.vocab import FINAL_JOB_STATUSES, LANES

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def metrics_dir(settings: Settings) -> Path:
    return settings.home / "metrics"


def _choose_dir() -> Path | None:
    """Every process of this machine writes into the same folder: set it before the first
    metric exists (prometheus_client picks its value class from the environment). Always
    from this process's LANEWAY_HOME, never inherited from a parent with another home."""
    path = metrics_dir(get_settings())
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # A read-only home must not stop the process: its metrics stay in memory, unseen.
        logging.getLogger(__name__).warning("no metrics folder %s: %s", path, exc)
        os.environ.pop(MULTIPROC_ENV, None)
        return None
    os.environ[MULTIPROC_ENV] = str(path)
    return path


DIR = _choose_dir()

# CollectorRegistry and generate_latest are imported from here (webapp/metrics.py), so that
# prometheus_client is always loaded after the environment is set.
from prometheus_client import (  # noqa: E402 - after the environment is set
    CollectorRegistry,  # noqa: F401
    Counter,
    Histogram,
    generate_latest,  # noqa: F401
    values,
)
from prometheus_client.core import GaugeMetricFamily  # noqa: E402
from prometheus_client.mmap_dict import MmapedDict  # noqa: E402
from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402

# Files are named <type>_<host>-<pid>.db: processes of several containers may share one
# folder (a shared LANEWAY_HOME volume), and only this host's dead processes may be folded.
HOST = socket.gethostname().replace("_", "-") or "localhost"
# prometheus_client asks for the process's identifier on every increment and observation
# (to notice a fork): kept here, and renewed in a forked child, rather than a getpid call
# and a string made each time.
_identity = [f"{HOST}-{process.pid()}"]


def _renew_identity() -> None:
    _identity[0] = f"{HOST}-{process.pid()}"  # core/util/process renews first


os.register_at_fork(after_in_child=_renew_identity)
if DIR is not None:
    values.ValueClass = values.MultiProcessValue(lambda: _identity[0])

# From a millisecond: an interactive batch's model stage takes a few.
FAST_BUCKETS = (0.001, 0.0025, 0.005)
LATENCY_BUCKETS = (*FAST_BUCKETS, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
JOB_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 8 * 3600, 86400)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

BATCH_SIZE = Histogram(
    "laneway_batch_size",
    "Texts per model micro-batch",
    ["lane"],
    buckets=BATCH_BUCKETS,
)
MODEL_SECONDS = Histogram(
    "laneway_model_stage_seconds",
    "Seconds of a model stage that ran (a chunk's, an interactive batch's)",
    ["lane"],
    buckets=LATENCY_BUCKETS,
)
JOB_SECONDS = Histogram(
    "laneway_job_seconds",
    "Seconds from a job's submission to its end",
    ["lane", "status"],
    buckets=JOB_BUCKETS,
)
ITEMS_PROCESSED = Counter("laneway_items_processed", "Items with a result", ["lane"])
ITEMS_FAILED = Counter("laneway_items_failed", "Items whose processing failed", ["lane"])
DEAD_LETTERS = Counter("laneway_dead_letters", "Dead letters recorded", ["kind"])
COST = Counter("laneway_cost_dollars", "Cost of finished jobs, in dollars", ["lane"])
STALE_REQUESTS = Counter(
    "laneway_interactive_stale_requests",
    "Interactive requests taken after their caller stopped waiting (stored as jobs instead)",
    ["lane"],
)


def record_stale(lane: str) -> None:
    STALE_REQUESTS.labels(lane).inc()


def record_items(lane: str, n_items: int, n_failed: int) -> None:
    """What a finished chunk or an interactive batch adds: its items and its failures."""
    ITEMS_PROCESSED.labels(lane).inc(n_items - n_failed)
    if n_failed:
        ITEMS_FAILED.labels(lane).inc(n_failed)


def record_model(lane: str, seconds: float, batches: Sequence[int]) -> None:
    """A model stage that ran, where it ran: its seconds and each micro-batch it forwarded
    (what dedup and the result cache left to compute, not what the chunk held). A stage
    that forwarded nothing (every text cached, or no model for its tasks) adds nothing."""
    if not batches:
        return
    MODEL_SECONDS.labels(lane).observe(seconds)
    for size in batches:
        BATCH_SIZE.labels(lane).observe(size)


def record_job(lane: str, status: str, seconds: float | None, cost: float | None) -> None:
    if seconds is not None:
        JOB_SECONDS.labels(lane, status).observe(seconds)
    if cost:
        COST.labels(lane).inc(cost)


def declare_series(lanes: Sequence[str] = LANES) -> None:
    """Every lane's job-end and item series, at 0, in this process's file. A series that
    first appears already at 1 shows Prometheus no increase(): without this, the first
    failed job of a worker's life would never raise LanewayJobsFailing. A worker's main
    process declares them once; its pool processes' counts add to them at the scrape."""
    for lane in lanes:
        for status in FINAL_JOB_STATUSES:
            JOB_SECONDS.labels(lane, status)
        ITEMS_PROCESSED.labels(lane)
        ITEMS_FAILED.labels(lane)


def record_dead_letters(kind: str, n: int) -> None:
    DEAD_LETTERS.labels(kind).inc(n)


def queue_families(depths: Mapping[str, Mapping[str, int]]) -> list[GaugeMetricFamily]:
    """Each queue's depth as gauges: queued, delivered (reserved or running) and both."""
    families = {
        "depth": GaugeMetricFamily(
            "laneway_queue_depth", "Messages queued, reserved or running", labels=["queue"]
        ),
        "queued": GaugeMetricFamily(
            "laneway_queue_queued", "Messages waiting in the queue", labels=["queue"]
        ),
        "delivered": GaugeMetricFamily(
            "laneway_queue_delivered",
            "Messages delivered to workers and not yet acknowledged",
            labels=["queue"],
        ),
    }
    for queue, depth in depths.items():
        for field, family in families.items():
            family.add_metric([queue], depth[field])
    return list(families.values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(path: Path) -> tuple[str, int] | None:
    """(host, pid) from a file's name; None for an archive (or anything else)."""
    host, _, pid = path.stem.rsplit("_", 1)[-1].rpartition("-")
    return (host, int(pid)) if host and pid.isdigit() else None


# A process's file is created empty and then sized: one killed in between (or read at that
# moment) leaves a file with no header, which prometheus_client cannot read.
HEADER = 8


def _holds_values(path: Path) -> bool:
    try:
        return path.stat().st_size >= HEADER
    except FileNotFoundError:
        return False


class FolderCollector(MultiProcessCollector):
    """prometheus_client's collector over the folder, less the files not yet sized."""

    def collect(self) -> Iterator[Any]:
        files = [str(f) for f in Path(self._path).glob("*.db") if _holds_values(f)]
        return self.merge(files, accumulate=True)


class CompactingCollector(FolderCollector):
    """The folder at each scrape, its dead processes' files folded first (compact), under
    the folder's lock: what a scrape of the folder serves, from the web app or a worker."""

    def collect(self) -> Iterator[Any]:
        path = Path(self._path)
        with locked(path):
            compact(path)
            return iter(list(super().collect()))


@contextmanager
def locked(path: Path) -> Iterator[None]:
    with open(path / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def compact(path: Path, alive=_alive, host: str = HOST) -> list[Path]:  # noqa: ANN001
    """Fold the files of this host's dead processes into `<type>_archive.db` (counters and
    histogram buckets add up) and delete their gauges; returns the files removed. Call
    under the folder's lock."""
    removed = []
    archives: dict[str, MmapedDict] = {}
    try:
        for f in sorted(path.glob("*.db")):
            owner = _owner(f)
            if owner is None or owner[0] != host or alive(owner[1]):
                continue
            kind = f.name.split("_", 1)[0]
            # A file killed before it was sized recorded nothing: it is only removed.
            if kind in ("counter", "histogram", "summary") and _holds_values(f):
                archive = archives.get(kind)
                if archive is None:
                    archive = archives[kind] = MmapedDict(str(path / f"{kind}_archive.db"))
                for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(str(f)):
                    archive.write_value(key, archive.read_value(key)[0] + value, timestamp)
            f.unlink()
            removed.append(f)
    finally:
        for archive in archives.values():
            archive.close()
    return removed
