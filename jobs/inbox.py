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

Nothing in a folder is trusted: every folder and file is opened from its parent's
descriptor without following a link, and what was opened is checked (core/util/safefs.py).
A link, a pipe, a device, a hard-linked file or a name with a control character is
rejected with a report; each entry is handled alone, so none stops the scan.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from datetime import UTC
from typing import Any, BinaryIO

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from core.config.settings import Settings, get_settings
from core.obs.logsafe import printable, unprintable
from core.queueing.celery_app import TRANSIENT_ERRORS
from core.util import safefs
from db.common import aware
from db.models import Account, InboxFile, Job
from db.session import session_factory
from jobs.inputs import (
    FILE_TYPES,
    InputError,
    Limits,
    TruncatedInput,
    file_items,
    size_error,
)
from jobs.submit import send_job, store_job

log = logging.getLogger("jobs.inbox")

PROCESSED, REJECTED = "processed", "rejected"
WORKING = ".laneway-working"  # a dot-folder at the inbox root: never taken for an account
LOCK = ".lock"
# Names uploaders give a file while they write it, before renaming it into place.
IN_PROGRESS = (".part", ".partial", ".tmp", ".temp", ".crdownload", ".filepart", ".upload", "~")
TRUNCATED_GZIP_GRACE = 24 * 3600  # seconds a settled gzip file without its end may wait
NAME_MAX = 255  # bytes in a file name (Linux, every common filesystem)
ACCOUNT_FOLDER = "an account's folder must be a real folder on the inbox's filesystem"


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
        """For output (JSON, a task's result): names escaped as the logs show them."""
        out = {k: v for k, v in asdict(self).items() if v is not None}
        out["account"], out["name"] = printable(self.account), printable(self.name)
        return out


def outbox_stem(name: str) -> str:
    """The file's name without `.gz` and its type: `orders.csv.gz` -> `orders`; cut to
    leave room for `-2-results.jsonl` and a temporary name within NAME_MAX."""
    stem = name[:-3] if name.lower().endswith(".gz") else name
    for ext in FILE_TYPES:
        if stem.lower().endswith(ext):
            stem = stem[: -len(ext)]
            break
    while len(stem.encode()) > NAME_MAX - 64:
        stem = stem[:-1]
    return stem


def _in_progress(name: str) -> bool:
    return name.startswith(".") or name.lower().endswith(IN_PROGRESS)


def _settled_for(stat: os.stat_result, now: float) -> float:
    return now - max(stat.st_mtime, stat.st_ctime)


def _name_problem(name: str) -> str | None:
    char = unprintable(name)
    if char is None:
        return None
    return (
        f"the file name holds a control character or an invalid byte ({char!r}): rename "
        "the file and drop it again"
    )


def inbox_limits(settings: Settings) -> Limits:
    """What one inbox file may hold: items, characters, bytes (inflated), blank lines."""
    return Limits(
        settings.inbox_max_items,
        settings.max_text_chars,
        "LANEWAY_INBOX_MAX_ITEMS",
        max_bytes=settings.inbox_max_bytes,
        max_bytes_setting="LANEWAY_INBOX_MAX_BYTES",
        max_blank_lines=settings.max_blank_lines,
    )


@dataclass
class _Folder:
    """An account's folder, open, and this scan's folder for the files it claims there."""

    name: str
    fd: int
    claims: int

    def label(self, name: str) -> str:
        return f"{printable(self.name)}/{printable(name)}"


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)


class Scan:
    """One pass over the inbox, holding a locked working folder for the files it claims.
    Every folder is opened from the inbox's own descriptor, never through a link
    (core/util/safefs.py); each entry is handled alone, so no entry stops the scan."""

    def __init__(self, settings: Settings, progress: Callable[[str], None] | None = None):
        self.settings = settings
        self.inbox = settings.inbox_dir
        self.progress = progress or (lambda message: log.info("%s", message))
        self.scan_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.root = self.scan_fd = -1
        self.dev = 0

    def run(self) -> list[Outcome]:
        self.root = safefs.open_root(self.inbox)
        working = -1
        try:
            self.dev = os.fstat(self.root).st_dev
            working = self._working_root()
            self._recover_abandoned(working)
            with self._locked(working):
                return self._scan_root()
        finally:
            _close(working, self.root)

    def _working_root(self) -> int:
        """`.laneway-working`, a real folder: anything else under its name is set aside."""
        try:
            return safefs.open_dir(WORKING, self.root, self.dev, create=True)
        except safefs.Refused as exc:
            aside = f"{WORKING}.refused-{uuid.uuid4().hex[:8]}"
            os.rename(WORKING, aside, src_dir_fd=self.root, dst_dir_fd=self.root)
            log.warning("%s was %s: set aside as %s", WORKING, exc, aside)
            return safefs.open_dir(WORKING, self.root, self.dev, create=True)

    @contextmanager
    def _locked(self, working: int) -> Iterator[None]:
        os.mkdir(self.scan_id, dir_fd=working)
        self.scan_fd = safefs.open_dir(self.scan_id, working, self.dev)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        lock = os.open(LOCK, flags, 0o600, dir_fd=self.scan_fd)
        try:
            # Held while this scan runs; the kernel drops it if the process dies.
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        finally:
            # A file that could not be put back stays, for the next scan to put back.
            try:
                if _remove_empty(self.scan_fd):
                    os.unlink(LOCK, dir_fd=self.scan_fd)
                    os.rmdir(self.scan_id, dir_fd=working)
                else:
                    log.error("%s/%s: files left for the next scan", WORKING, self.scan_id)
            except OSError as exc:
                log.error("%s/%s: not removed (%s)", WORKING, self.scan_id, exc)
            _close(self.scan_fd, lock)

    def _recover_abandoned(self, working: int) -> None:
        """Put back the files of scans that died holding them (their lock is free)."""
        for name in os.listdir(working):
            try:
                folder = safefs.open_dir(name, working, self.dev)
            except safefs.Refused:
                with suppress(OSError):
                    os.unlink(name, dir_fd=working)  # not ours: the entry itself goes
                continue
            except OSError:
                continue
            try:
                if self._put_back_abandoned(folder):
                    shutil.rmtree(name, dir_fd=working, ignore_errors=True)
            except OSError as exc:  # a scan's leftovers never stop the scans after it
                log.error("%s/%s: not recovered (%s)", WORKING, printable(name), exc)
            finally:
                os.close(folder)

    def _put_back_abandoned(self, folder: int) -> bool:
        """True when the dead scan's folder may go: every file put back, or none there."""
        try:
            lock = os.open(LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        except OSError:
            # A scan that died before locking claimed nothing: an old one is debris.
            old = time.time() - os.fstat(folder).st_mtime > 3600
            return old and not os.listdir(folder)
        with os.fdopen(lock) as held:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a live scan
            accounts = [name for name in os.listdir(folder) if name != LOCK]
            if not accounts:
                # Nothing claimed: a scan between its lock's creation and its flock, or
                # one that died claiming nothing (debris once old).
                return time.time() - os.fstat(folder).st_mtime > 3600
            complete = True
            for account in accounts:
                complete &= self._put_back_account(folder, account)
            return complete

    def _put_back_account(self, folder: int, account: str) -> bool:
        src = dst = -1
        try:
            src = safefs.open_dir(account, folder, self.dev)
            dst = safefs.open_dir(account, self.root, self.dev, create=True)
            for entry in os.listdir(src):
                safefs.move_no_clobber(entry, src, dst)
                where = f"{printable(account)}/{printable(entry)}"
                log.warning("%s: put back, left by a scan that died", where)
            return True
        except (safefs.Refused, OSError) as exc:
            log.error("%s: files of a scan that died not put back: %s", printable(account), exc)
            return False
        finally:
            _close(src, dst)

    def _scan_root(self) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for name in sorted(os.listdir(self.root)):
            if name.startswith("."):
                continue
            st = safefs.lstat(name, self.root)
            if st is None:
                continue
            if stat.S_ISDIR(st.st_mode):
                outcomes += self._scan_account(name)
            elif stat.S_ISREG(st.st_mode):
                if not _in_progress(name):
                    outcomes.append(Outcome("", name, "ignored", "not in an account's folder"))
            else:
                problem = safefs.folder_problem(st, self.dev)
                outcomes.append(self._refused("", name, f"{problem}: {ACCOUNT_FOLDER}"))
        return outcomes

    def _refused(self, account: str, name: str, problem: str | None) -> Outcome:
        """An entry left where it is (nothing safe to move it into), told and logged."""
        where = f"{printable(account)}/{printable(name)}" if account else printable(name)
        self.progress(f"{where}: refused, left in place: {problem}")
        return Outcome(account, name, "rejected", f"{problem}; left in place")

    def _scan_account(self, name: str) -> list[Outcome]:
        fd = claims = -1
        try:
            fd = safefs.open_dir(name, self.root, self.dev)
            for sub in (PROCESSED, REJECTED):
                st = safefs.lstat(sub, fd)
                problem = safefs.folder_problem(st, self.dev) if st else None
                if problem:
                    why = f"{problem}: nothing is taken from this account's folder until it is"
                    return [self._refused(name, sub, why + " a real folder")]
            entries = sorted(os.listdir(fd))
            os.mkdir(name, dir_fd=self.scan_fd)
            claims = safefs.open_dir(name, self.scan_fd, self.dev)
        except safefs.Refused as exc:
            _close(claims, fd)
            return [self._refused("", name, f"{exc}: {ACCOUNT_FOLDER}")]
        except OSError as exc:  # unreadable (permissions): the other accounts go on
            _close(claims, fd)
            return [self._refused("", name, f"cannot be read ({exc.strerror})")]
        try:
            folder = _Folder(name, fd, claims)
            account = self._account(name)
            now = time.time()
            outcomes = (self._entry(account, folder, entry, now) for entry in entries)
            return [outcome for outcome in outcomes if outcome is not None]
        finally:
            _close(claims, fd)

    def _account(self, name: str) -> Account | None:
        if unprintable(name) is not None:
            return None  # no account has such a name (and the database stores none)
        with session_factory(self.settings)() as session:
            account = session.scalar(select(Account).where(Account.name == name))
            if account is not None:
                session.expunge(account)
        return account

    def _entry(
        self, account: Account | None, folder: _Folder, name: str, now: float
    ) -> Outcome | None:
        if _in_progress(name) or name in (PROCESSED, REJECTED):
            return None
        try:
            st = safefs.lstat(name, folder.fd)
        except OSError as exc:
            return self._refused(folder.name, name, f"cannot be examined ({exc.strerror})")
        if st is None:
            return None
        if stat.S_ISDIR(st.st_mode):
            detail = "a folder: only the files directly in the account's folder are taken"
            return Outcome(folder.name, name, "ignored", detail)
        problem = _name_problem(name) or safefs.file_problem(st, self.dev)
        if problem is None:
            waited = _settled_for(st, now)
            if waited < self.settings.inbox_settle:
                return Outcome(folder.name, name, "waiting", f"changed {waited:.0f} s ago")
        try:
            # Claimed by moving the entry itself (a link stays a link, never followed).
            safefs.rename_noreplace(name, folder.fd, name, folder.claims)
        except (FileNotFoundError, FileExistsError):
            return Outcome(folder.name, name, "taken", "by another scan")
        except OSError as exc:
            return self._refused(folder.name, name, f"cannot be taken ({exc.strerror})")
        try:
            if problem is not None:
                return self._reject(folder, name, problem)
            return self._take(account, folder, name, st)
        except TRANSIENT_ERRORS:
            # Not the file's fault (the database went away...): it goes back for next time.
            log.exception("%s: ingest failed; the file goes back to the inbox", folder.label(name))
            self._put_back(folder, name)
            raise
        except Exception as exc:  # noqa: BLE001 - one entry never stops the scan
            log.exception("%s: ingest failed; the file goes back to the inbox", folder.label(name))
            self._put_back(folder, name)
            detail = f"failed ({type(exc).__name__}); tried again at the next scan"
            return Outcome(folder.name, name, "waiting", detail)

    def _put_back(self, folder: _Folder, name: str) -> None:
        try:
            safefs.move_no_clobber(name, folder.claims, folder.fd)
        except (safefs.Refused, OSError) as exc:
            log.error("%s: not put back (%s); the next scan will", folder.label(name), exc)

    def _move_into(self, folder: _Folder, name: str, sub: str) -> tuple[int, str]:
        """Move a claimed file into the account's `sub` folder: (that folder, its name)."""
        fd = safefs.open_dir(sub, folder.fd, self.dev, create=True)
        try:
            return fd, safefs.move_no_clobber(name, folder.claims, fd)
        except BaseException:
            os.close(fd)
            raise

    def _take(
        self, account: Account | None, folder: _Folder, name: str, seen: os.stat_result
    ) -> Outcome:
        label = folder.label(name)
        if account is None:
            return self._reject(
                folder,
                name,
                f"no account named {folder.name!r}: the folder's name must be an account's "
                "name (laneway accounts create NAME)",
            )
        try:
            fh, opened = safefs.open_file(name, folder.claims, seen)
        except safefs.Refused as exc:
            return self._reject(folder, name, str(exc))
        started = time.perf_counter()
        limits = inbox_limits(self.settings)
        with fh:
            try:
                if not name.lower().endswith(".gz") and opened.st_size > limits.max_bytes:
                    raise InputError(size_error(limits, gzipped=False))
                stored = store_file(self.settings, account, name, fh, opened.st_size, self.progress)
            except TruncatedInput as exc:
                if time.time() - seen.st_mtime < TRUNCATED_GZIP_GRACE:
                    self._put_back(folder, name)
                    return Outcome(folder.name, name, "waiting", f"incomplete: {exc}")
                return self._reject(folder, name, str(exc))
            except InputError as exc:
                return self._reject(folder, name, str(exc))
        if isinstance(stored, InboxFile):
            return self._duplicate(folder, name, stored)
        if stored is None:
            self._put_back(folder, name)
            return Outcome(folder.name, name, "waiting", "its outbox name was just taken")
        job = stored
        # Committed: the file is done with whatever happens next.
        try:
            os.close(self._move_into(folder, name, PROCESSED)[0])
        except (safefs.Refused, OSError) as exc:
            log.error("%s: ingested, not moved to %s/ (%s)", label, PROCESSED, exc)
            self._put_back(folder, name)  # the next scan finds it a duplicate
        send_job(job, self.settings)
        seconds = time.perf_counter() - started
        detail = f"{job.total_items} items in {seconds:.1f} s, {job.lane} lane"
        self.progress(f"{label}: ingested as job {job.id} ({detail})")
        return Outcome(folder.name, name, "ingested", detail, str(job.id), job.total_items)

    def _duplicate(self, folder: _Folder, name: str, first: InboxFile) -> Outcome:
        received = aware(first.created_at).astimezone(UTC)  # type: ignore[union-attr]
        message = (
            f"duplicate: the same content was ingested from {first.name!r} on "
            f"{received:%Y-%m-%d %H:%M} UTC as job {first.job_id}; not ingested again"
        )
        advice = f"Its results are (or will be) in the outbox as {first.stem}-results.*."
        outcome = self._reject(folder, name, message, advice)
        outcome.status, outcome.job_id = "duplicate", str(first.job_id)
        return outcome

    def _reject(
        self,
        folder: _Folder,
        name: str,
        message: str,
        advice: str = "Fix the file and drop it into the inbox again.",
    ) -> Outcome:
        """Into `rejected/` beside a report naming the problem; left in the account's folder
        when `rejected/` cannot be used (it turned into a link meanwhile)."""
        try:
            fd, target = self._move_into(folder, name, REJECTED)
        except (safefs.Refused, OSError) as exc:
            self._put_back(folder, name)
            return self._refused(folder.name, name, f"{message} ({REJECTED}/: {exc})")
        try:
            report = f"{printable(name)} was not ingested.\n\n{message}\n\n{advice}\n"
            safefs.write_atomically(fd, _report_name(target), [report])
        finally:
            os.close(fd)
        self.progress(f"{folder.label(name)}: rejected: {message}")
        return Outcome(folder.name, name, "rejected", message)


def _report_name(target: str) -> str:
    """`<target>.error.txt`, the target's name shortened where the whole would be longer
    than a file name may be (with room for the temporary name it is written under)."""
    while len(os.fsencode(f".{target}.error.txt.12345678.tmp")) > NAME_MAX:
        target = target[:-1]
    return f"{target}.error.txt"


def _remove_empty(scan_fd: int) -> bool:
    """Remove this scan's empty account folders; True when no file is left in any."""
    empty = True
    for name in os.listdir(scan_fd):
        if name == LOCK:
            continue
        try:
            os.rmdir(name, dir_fd=scan_fd)
        except OSError:
            empty = False
    return empty


def store_file(
    settings: Settings,
    account: Account,
    name: str,
    fh: BinaryIO,
    size: int,
    progress: Callable[[str], None] | None = None,
) -> Job | InboxFile | None:
    """Write an inbox file's job (`name`, read from `fh`, `size` bytes as it lies) in one
    transaction with its content hash: the job and its chunks (to dispatch); or the
    account's earlier file with the same content; or None when the outbox name chosen was
    taken by a concurrent scan meanwhile."""
    digest = hashlib.sha256()
    label = f"{printable(account.name)}/{printable(name)}"
    with session_factory(settings)() as session:
        job = store_job(
            session,
            account,
            file_items(name, fh, inbox_limits(settings), digest),
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
                name=name,
                stem=_free_stem(session, account.id, outbox_stem(name)),
                size=size,
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
    return job


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
