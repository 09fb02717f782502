"""bench/profile_summary.py: py-spy's raw stacks counted by function."""

from __future__ import annotations

from bench.profile_summary import main, shares

STACKS = [
    "proc;run (app.py:10);handle (app.py:20);read (io.py:5) 3\n",
    "proc;run (app.py:10);handle (app.py:21) 2\n",
    "proc;run (app.py:11);walk (tree.py:1);walk (tree.py:2) 5\n",  # recursion counts once
    "\n",
    "garbage without a count\n",
]


def test_samples_count_by_function_whatever_the_line() -> None:
    total, own, anywhere = shares(STACKS)
    assert total == 10
    assert own == {"read (io.py)": 3, "handle (app.py)": 2, "walk (tree.py)": 5}
    assert anywhere["run (app.py)"] == 10 and anywhere["proc"] == 10
    assert anywhere["handle (app.py)"] == 5 and anywhere["walk (tree.py)"] == 5


def test_the_report_prints_shares_of_the_files_together(tmp_path, capsys) -> None:
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("".join(STACKS[:2]))
    second.write_text("".join(STACKS[2:]))
    main([str(first), str(second), "--top", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "10 samples"
    assert out[1:4] == ["--- self", " 50.0 %  walk (tree.py)", " 30.0 %  read (io.py)"]
    assert out[4] == "--- inclusive" and len(out) == 7
