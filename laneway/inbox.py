"""The nightly inbox: files dropped under LANEWAY_INBOX_DIR/<account>/ become jobs.

A scan (beat, on LANEWAY_INBOX_SCHEDULE; or `laneway inbox scan`) takes each complete file:
- **complete**: not a dot-file nor named like an upload in progress (`.part`, `.tmp`, ...),
  and neither written nor renamed for LANEWAY_INBOX_SETTLE seconds (its mtime and ctime;
  a copy that restores an old mtime still moves the ctime); a gzip file must also end with
  its end-of-stream marker, or it waits (a day at most, then it is rejected as truncated);
- **claimed** by an atomic rename into this scan's working folder, so two scans (two beats,
  or beat and the command) never take the same file; a scan that died leaves its folder
  unlocked, and the next scan puts its files back;
- **ingested** in one transaction: items stream into the database, and the SHA-256 of the
  (decompressed) content goes into `inbox_files`, unique per account, so the same content
  is never ingested twice for an account, even by two scans at once; a second copy is
  rejected as a duplicate naming the first one's job;
- then moved to `<account>/processed/`, or to `<account>/rejected/` beside a
  `<file>.error.txt` that names the problem and the line.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from db.models import Account, InboxFile, Job
from db.queries import ChunkRef, aware
from db.session import session_factory
from laneway.inputs import FILE_TYPES, InputError, Limits, TruncatedInput, file_items
from laneway.jobs import send_job, store_job
from laneway.outbox import write_atomically
from laneway.settings import Settings, get_settings

log = logging.getLogger("laneway.inbox")

PROCESSED, REJECTED = "processed", "rejected"
WORKING = ".laneway-working"  # a dot-folder at the inbox root: never taken for an account
LOCK = ".lock"
# Names uploaders give a file while they write it, before renaming it into place.
IN_PROGRESS = (".part", ".partial", ".tmp", ".temp", ".crdownload", ".filepart", ".upload", "~")
TRUNCATED_GZIP_GRACE = 24 * 3600  # seconds a settled gzip file without its end may wait


@dataclass
class Outcome:
    """What a scan did with one file."""

    account: str
    name: str
    status: str  # ingested | rejected | duplicate | waiting | taken | ignored
    detail: str = ""
    job_id: str | None = None
    items: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def outbox_stem(name: str) -> str:
    """The file's name without `.gz` and its type: `orders.csv.gz` -> `orders`."""
    stem = name[:-3] if name.lower().endswith(".gz") else name
    for ext in FILE_TYPES:
        if stem.lower().endswith(ext):
            return stem[: -len(ext)]
    return stem


def _in_progress(name: str) -> bool:
    return name.startswith(".") or name.lower().endswith(IN_PROGRESS)


def _settled_for(stat: os.stat_result, now: float) -> float:
    return now - max(stat.st_mtime, stat.st_ctime)


def _move_no_clobber(src: Path, folder: Path, name: str) -> Path:
    """Move src into folder under name, or name-2, name-3, ... when taken: never over a
    file already there (a link fails rather than replace, unlike a rename)."""
    folder.mkdir(parents=True, exist_ok=True)
    stem, dot, ext = name.partition(".")
    for n in range(1, 10_000):
        target = folder / (name if n == 1 else f"{stem}-{n}{dot}{ext}")
        try:
            os.link(src, target)
        except FileExistsError:
            continue
        src.unlink()
        return target
    raise RuntimeError(f"no free name for {name} in {folder}")


class Scan:
    """One pass over the inbox, holding a locked working folder for the files it claims."""

    def __init__(self, settings: Settings, progress: Callable[[str], None] | None = None):
        self.settings = settings
        self.inbox = settings.inbox_dir
        self.progress = progress or (lambda message: log.info("%s", message))
        scan_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.working = self.inbox / WORKING / scan_id

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.working.mkdir(parents=True)
        with open(self.working / LOCK, "w") as lock:
            # Held while this scan runs; the kernel drops it if the process dies.
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                shutil.rmtree(self.working, ignore_errors=True)

    def run(self) -> list[Outcome]:
        self.inbox.mkdir(parents=True, exist_ok=True)
        self._recover_abandoned()
        outcomes: list[Outcome] = []
        with self._locked():
            for folder in sorted(p for p in self.inbox.iterdir() if p.is_dir()):
                if folder.name.startswith("."):
                    continue
                outcomes += self._scan_account(folder)
            for path in sorted(p for p in self.inbox.iterdir() if p.is_file()):
                if not _in_progress(path.name):
                    outcomes.append(Outcome("", path.name, "ignored", "not in an account's folder"))
        return outcomes

    def _recover_abandoned(self) -> None:
        """Put back the files of scans that died holding them (their lock is free)."""
        root = self.inbox / WORKING
        if not root.is_dir():
            return
        for folder in root.iterdir():
            if not (folder / LOCK).exists():
                # A scan that died before locking claimed nothing: an old one is debris.
                if time.time() - folder.stat().st_mtime > 3600 and not any(folder.iterdir()):
                    folder.rmdir()
                continue
            try:
                lock = open(folder / LOCK, "a")  # noqa: SIM115 - closed below
            except OSError:
                continue
            with lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live scan
                for account in (p for p in folder.iterdir() if p.is_dir()):
                    for path in account.iterdir():
                        _move_no_clobber(path, self.inbox / account.name, path.name)
                        log.warning("%s/%s: put back, left by a scan that died", *path.parts[-2:])
                shutil.rmtree(folder, ignore_errors=True)

    def _scan_account(self, folder: Path) -> list[Outcome]:
        with session_factory(self.settings)() as session:
            account = session.scalar(select(Account).where(Account.name == folder.name))
            if account is not None:
                session.expunge(account)
        outcomes = []
        now = time.time()
        for path in sorted(folder.iterdir()):
            if not path.is_file() or _in_progress(path.name):
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            waited = _settled_for(stat, now)
            if waited < self.settings.inbox_settle:
                outcomes.append(
                    Outcome(folder.name, path.name, "waiting", f"changed {waited:.0f} s ago")
                )
                continue
            claimed = self.working / folder.name / path.name
            claimed.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(path, claimed)
            except FileNotFoundError:
                outcomes.append(Outcome(folder.name, path.name, "taken", "by another scan"))
                continue
            outcomes.append(self._take(account, folder, claimed, stat))
        return outcomes

    def _take(
        self, account: Account | None, folder: Path, claimed: Path, stat: os.stat_result
    ) -> Outcome:
        name, label = claimed.name, f"{folder.name}/{claimed.name}"
        if account is None:
            return self._reject(
                folder,
                claimed,
                f"no account named {folder.name!r}: the folder's name must be an account's "
                "name (laneway accounts create NAME)",
            )
        started = time.perf_counter()
        try:
            stored = store_file(self.settings, account, claimed, self.progress)
        except TruncatedInput as exc:
            if time.time() - stat.st_mtime < TRUNCATED_GZIP_GRACE:
                _move_no_clobber(claimed, folder, name)
                return Outcome(folder.name, name, "waiting", f"incomplete: {exc}")
            return self._reject(folder, claimed, str(exc))
        except InputError as exc:
            return self._reject(folder, claimed, str(exc))
        except Exception:
            # Not the file's fault (the database went away...): it goes back for next time.
            log.exception("%s: ingest failed; the file goes back to the inbox", label)
            _move_no_clobber(claimed, folder, name)
            raise
        if isinstance(stored, InboxFile):
            return self._duplicate(folder, claimed, stored)
        if stored is None:
            _move_no_clobber(claimed, folder, name)
            return Outcome(folder.name, name, "waiting", "its outbox name was just taken")
        job, chunks = stored
        # Committed: the file is done with whatever happens next.
        _move_no_clobber(claimed, folder / PROCESSED, name)
        send_job(job, chunks)
        seconds = time.perf_counter() - started
        detail = f"{job.total_items} items in {seconds:.1f} s, {job.lane} lane"
        self.progress(f"{label}: ingested as job {job.id} ({detail})")
        return Outcome(folder.name, name, "ingested", detail, str(job.id), job.total_items)

    def _duplicate(self, folder: Path, claimed: Path, first: InboxFile) -> Outcome:
        received = aware(first.created_at).astimezone(UTC)  # type: ignore[union-attr]
        message = (
            f"duplicate: the same content was ingested from {first.name!r} on "
            f"{received:%Y-%m-%d %H:%M} UTC as job {first.job_id}; not ingested again"
        )
        advice = f"Its results are (or will be) in the outbox as {first.stem}-results.*."
        outcome = self._reject(folder, claimed, message, advice)
        outcome.status, outcome.job_id = "duplicate", str(first.job_id)
        return outcome

    def _reject(
        self,
        folder: Path,
        claimed: Path,
        message: str,
        advice: str = "Fix the file and drop it into the inbox again.",
    ) -> Outcome:
        target = _move_no_clobber(claimed, folder / REJECTED, claimed.name)
        report = target.with_name(f"{target.name}.error.txt")
        write_atomically(report, [f"{claimed.name} was not ingested.\n\n{message}\n\n{advice}\n"])
        self.progress(f"{folder.name}/{claimed.name}: rejected: {message}")
        return Outcome(folder.name, claimed.name, "rejected", message)


def store_file(
    settings: Settings,
    account: Account,
    path: Path,
    progress: Callable[[str], None] | None = None,
) -> tuple[Job, list[ChunkRef]] | InboxFile | None:
    """Write an inbox file's job in one transaction with its content hash: the job and its
    chunks (to dispatch); or the account's earlier file with the same content; or None
    when the outbox name chosen was taken by a concurrent scan meanwhile."""
    digest = hashlib.sha256()
    limits = Limits(settings.inbox_max_items, settings.max_text_chars, "LANEWAY_INBOX_MAX_ITEMS")
    label = f"{account.name}/{path.name}"
    with session_factory(settings)() as session, open(path, "rb") as fh:
        job, chunks = store_job(
            session,
            account,
            file_items(path.name, fh, limits, digest),
            tasks=settings.inbox_tasks,
            source="inbox",
            settings=settings,
            progress=(lambda n: progress(f"{label}: {n:,} lines read")) if progress else None,
        )
        sha256 = digest.hexdigest()
        session.add(
            InboxFile(
                account_id=account.id,
                sha256=sha256,
                job_id=job.id,
                name=path.name,
                stem=_free_stem(session, account.id, outbox_stem(path.name)),
                size=path.stat().st_size,
            )
        )
        try:
            # Waits for a concurrent scan holding the same content, then fails if it
            # committed: a content is in an account's `inbox_files` once at the most.
            session.commit()
        except IntegrityError:
            session.rollback()
            return session.scalar(
                select(InboxFile).where(
                    InboxFile.account_id == account.id, InboxFile.sha256 == sha256
                )
            )
    return job, chunks


def _free_stem(session: Any, account_id: int, stem: str) -> str:
    """`stem`, or `stem-2`, `stem-3`, ... when an earlier file of the account used it, so
    no outbox file is ever overwritten by a later night's file of the same name."""
    taken = set(
        session.scalars(
            select(InboxFile.stem).where(
                InboxFile.account_id == account_id, InboxFile.stem.startswith(stem, autoescape=True)
            )
        )
    )
    n, candidate = 1, stem
    while candidate in taken:
        n += 1
        candidate = f"{stem}-{n}"
    return candidate


def scan_inbox(
    settings: Settings | None = None, progress: Callable[[str], None] | None = None
) -> list[Outcome]:
    """Take every complete file in the inbox; what happened to each, in order."""
    return Scan(settings or get_settings(), progress).run()
