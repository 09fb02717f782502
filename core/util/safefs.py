"""Folders and files opened relative to a folder already opened, never by path again.

The inbox and the outbox hold folders their accounts write into. Every entry is opened
with `O_NOFOLLOW` from the file descriptor of a folder that was itself opened that way,
and what was opened is checked with `fstat` (a regular file, on the folder's filesystem,
with no other hard link), rather than a path checked and then opened: a symbolic link is
never followed, and nothing swapped in between the check and the use is read or written.
Moves are `renameat2(RENAME_NOREPLACE)` between folder descriptors (the standard library
has no such call, and `os.rename` would replace a file already there).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import uuid
from collections.abc import Callable, Iterable
from typing import BinaryIO

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a named pipe swapped in after the check must not hang the open.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
RENAME_NOREPLACE = 1
_renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)


class Refused(Exception):
    """An entry that is not what it must be (a link, a pipe, another filesystem...)."""


def kind(mode: int) -> str:
    """What an entry is, in words."""
    for test, words in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return words
    return "an entry of unknown kind"


def lstat(name: str, dir_fd: int) -> os.stat_result | None:
    """The entry itself (a link is not followed), or None when it is gone."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _not_a(st: os.stat_result, test: Callable[[int], bool], noun: str, dev: int) -> str | None:
    if not test(st.st_mode):
        never = " (never followed)" if stat.S_ISLNK(st.st_mode) else ""
        return f"{kind(st.st_mode)}{never}, not {noun}"
    if st.st_dev != dev:
        return f"{noun} on another filesystem"
    return None


def file_problem(st: os.stat_result, dev: int) -> str | None:
    """Why an entry may not be read as a file of the folder on `dev`, or None."""
    problem = _not_a(st, stat.S_ISREG, "a regular file", dev)
    if problem is None and st.st_nlink > 1:
        # A hard link is another name for a file that may be another account's.
        return (
            f"a file with {st.st_nlink} hard links: one linked from elsewhere is never read "
            "(copy the file in instead)"
        )
    return problem


def folder_problem(st: os.stat_result, dev: int) -> str | None:
    """Why an entry may not be used as a folder on `dev`, or None."""
    return _not_a(st, stat.S_ISDIR, "a folder", dev)


def open_root(path: os.PathLike[str] | str) -> int:
    """The operator's own folder (LANEWAY_INBOX_DIR, LANEWAY_OUTBOX_DIR), created when
    missing: the top from which every other folder is opened."""
    os.makedirs(path, exist_ok=True)
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_dir(name: str, dir_fd: int, dev: int, create: bool = False) -> int:
    """The real folder `name` in `dir_fd` on filesystem `dev` (made when missing if
    `create`), opened; Refused for anything else."""
    if create:
        try:
            os.mkdir(name, dir_fd=dir_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        st = lstat(name, dir_fd)
        raise Refused(folder_problem(st, dev) if st else "gone") from None
    problem = folder_problem(os.fstat(fd), dev)
    if problem:
        os.close(fd)
        raise Refused(problem)
    return fd


def open_file(name: str, dir_fd: int, expect: os.stat_result) -> tuple[BinaryIO, os.stat_result]:
    """The regular file `name` in `dir_fd` opened for reading, checked to be the very entry
    `expect` (what `lstat` saw) and still a file to read; Refused otherwise."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused("a symbolic link (never followed), not a regular file") from None
        raise Refused(f"cannot be opened ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        problem = file_problem(st, expect.st_dev)
        if problem is None and (st.st_dev, st.st_ino) != (expect.st_dev, expect.st_ino):
            problem = "replaced while it was being taken"
        if problem:
            raise Refused(problem)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st
    except BaseException:
        os.close(fd)
        raise


def rename_noreplace(src: str, src_fd: int, dst: str, dst_fd: int) -> None:
    """Move an entry (a link itself, never its target) between folders; FileExistsError
    when `dst` is taken, which is never replaced."""
    if _renameat2 is not None:
        if _renameat2(src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), src)
    # A filesystem without renameat2: a link fails rather than replace, then the old name goes.
    os.link(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)
    os.unlink(src, dir_fd=src_fd)


def move_no_clobber(name: str, src_fd: int, dst_fd: int) -> str:
    """Move `name` into the folder `dst_fd` under its name, or name-2, name-3, ... when
    taken (never over an entry already there); the name it got."""
    stem, dot, ext = name.partition(".")
    for n in range(1, 10_000):
        target = name if n == 1 else f"{stem}-{n}{dot}{ext}"
        try:
            rename_noreplace(name, src_fd, target, dst_fd)
        except FileExistsError:
            continue
        return target
    raise Refused(f"no free name for {name!r}")


def write_atomically(dir_fd: int, name: str, blocks: Iterable[str]) -> None:
    """Write `name` in the folder `dir_fd` under a fresh dot-name (pickup tools skip those),
    then rename it into place: a link planted under `name` is replaced, never followed."""
    prefix = f".{name}."
    for entry in os.listdir(dir_fd):
        if entry.startswith(prefix) and entry.endswith(".tmp"):
            os.unlink(entry, dir_fd=dir_fd)  # left by an attempt that died
    tmp = f"{prefix}{uuid.uuid4().hex[:8]}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o666, dir_fd=dir_fd)
    try:
        with open(fd, "w", encoding="utf-8", newline="") as fh:
            for block in blocks:
                fh.write(block)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        os.unlink(tmp, dir_fd=dir_fd)
        if isinstance(exc, IsADirectoryError):
            raise Refused(f"{name!r} is a folder: nothing is written over it") from None
        raise
