"""Folder-relative file operations: nothing followed, nothing replaced, what was opened
checked."""

from __future__ import annotations

import os

import pytest

from core.util import safefs


@pytest.fixture
def folders(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fds = [os.open(tmp_path / name, safefs.DIR_FLAGS) for name in ("a", "b")]
    yield tmp_path / "a", tmp_path / "b", *fds
    for fd in fds:
        os.close(fd)


@pytest.fixture(params=["renameat2", "link"])
def moves(request, monkeypatch):
    """Both ways of moving: renameat2, and the link-then-unlink of filesystems without it."""
    if request.param == "link":
        monkeypatch.setattr(safefs, "_renameat2", None)
    return request.param


def test_a_move_never_replaces_and_takes_the_next_free_name(folders, moves):
    a, b, a_fd, b_fd = folders
    (a / "x.csv").write_text("new")
    (b / "x.csv").write_text("old")
    (b / "x-2.csv").write_text("older")
    with pytest.raises(FileExistsError):
        safefs.rename_noreplace("x.csv", a_fd, "x.csv", b_fd)
    assert safefs.move_no_clobber("x.csv", a_fd, b_fd) == "x-3.csv"
    assert [(b / n).read_text() for n in ("x.csv", "x-2.csv", "x-3.csv")] == ["old", "older", "new"]
    assert not (a / "x.csv").exists()


def test_a_link_moves_as_a_link(folders, moves):
    a, b, a_fd, b_fd = folders
    os.symlink("/etc/passwd", a / "p.csv")
    safefs.move_no_clobber("p.csv", a_fd, b_fd)
    assert os.readlink(b / "p.csv") == "/etc/passwd"


def test_open_dir_refuses_links_files_and_makes_missing_folders(folders):
    a, _, a_fd, _ = folders
    dev = os.fstat(a_fd).st_dev
    os.symlink("/tmp", a / "link")
    (a / "file").write_text("x")
    with pytest.raises(safefs.Refused, match=r"a symbolic link \(never followed\), not a folder"):
        safefs.open_dir("link", a_fd, dev, create=True)
    with pytest.raises(safefs.Refused, match="a regular file, not a folder"):
        safefs.open_dir("file", a_fd, dev)
    with pytest.raises(safefs.Refused, match="on another filesystem"):
        os.close(safefs.open_dir("new", a_fd, dev + 1, create=True))
    os.close(safefs.open_dir("made", a_fd, dev, create=True))
    assert (a / "made").is_dir()


def test_open_file_reads_only_the_regular_file_it_was_shown(folders):
    a, _, a_fd, _ = folders
    (a / "f.csv").write_text("data")
    seen = safefs.lstat("f.csv", a_fd)
    fh, st = safefs.open_file("f.csv", a_fd, seen)
    with fh:
        assert fh.read() == b"data" and st.st_ino == seen.st_ino
    # Swapped for another file between the look and the open: refused.
    (a / "other").write_text("other")  # made first: a fresh inode, not the freed one
    os.rename(a / "other", a / "f.csv")
    with pytest.raises(safefs.Refused, match="replaced"):
        safefs.open_file("f.csv", a_fd, seen)
    # Swapped for a link: refused without following it.
    os.unlink(a / "f.csv")
    os.symlink("/etc/passwd", a / "f.csv")
    with pytest.raises(safefs.Refused, match="symbolic link"):
        safefs.open_file("f.csv", a_fd, seen)
    # A second name for the file: refused.
    os.unlink(a / "f.csv")
    (a / "f.csv").write_text("x")
    os.link(a / "f.csv", a / "g.csv")
    with pytest.raises(safefs.Refused, match="2 hard links"):
        safefs.open_file("f.csv", a_fd, safefs.lstat("f.csv", a_fd))


def test_write_atomically_replaces_a_planted_link_and_clears_stale_temp_files(folders, tmp_path):
    a, _, a_fd, _ = folders
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, a / "out.json")
    (a / ".out.json.1234abcd.tmp").write_text("left by a writer that died")
    (a / ".out.json*.keep").write_text("not a temp file of ours")
    safefs.write_atomically(a_fd, "out.json", ["{}", "\n"])
    assert victim.read_text() == "keep" and (a / "out.json").read_text() == "{}\n"
    assert sorted(os.listdir(a)) == [".out.json*.keep", "out.json"]
    (a / "dir").mkdir()
    with pytest.raises(safefs.Refused, match="is a folder"):
        safefs.write_atomically(a_fd, "dir", ["x"])
    assert sorted(os.listdir(a)) == [".out.json*.keep", "dir", "out.json"]
