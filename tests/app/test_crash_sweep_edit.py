"""``kill -9`` of ``edit`` at every step that changes the disk (core/crashpoint.py), as a user runs
it, on a dataset LeRobot wrote (vid24: two cameras, a cut inside an episode re-encodes a group of
pictures): the source is byte for byte as it was, ``--out`` is absent, as it was or complete
(never half written), nothing but ``src`` and ``out`` is left next to them after the rerun, and
the rerun writes the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.app.hostile import LOCK, cli, copy_fixture, ok, tree
from tests.app.test_crash_sweep import check_exit, crash, near, points, published

EDIT = ("--drop-frames", "3:5-9", "--drop-episodes", "7")

pytestmark = pytest.mark.slow


MARKER = ".episodekit-surgery.json"  # names the source by its path: differs from run to run here


def body(state: dict | None) -> dict | None:
    """An output's tree but for the marker naming its source's path."""
    return None if state is None else {k: v for k, v in state.items() if k != MARKER}


def edit(src: Path, out: Path, *extra: str) -> tuple:
    return ("edit", src, *EDIT, *extra, "--out", out)


def test_edit_new_out_killed_at_every_step(tmp_path):
    ref = copy_fixture("vid24", tmp_path / "ref" / "src")
    source = tree(ref)
    steps = points(tmp_path, *edit(ref, ref.parent / "out"))
    assert "staging: made" in steps and "publish: rename" in steps, steps
    complete = body(tree(ref.parent / "out"))
    for n, step in enumerate(steps, 1):
        parent = tmp_path / f"KILL-{n}"
        src = copy_fixture("vid24", parent / "src")
        out = parent / "out"
        run = crash("KILL", n, *edit(src, out))
        where = f"KILL at {n} ({step}): exit {run.returncode}\n{run.stderr}"
        check_exit("KILL", run, where)
        assert tree(src) == source and LOCK not in tree(src), where  # the source untouched
        state = body(published(out)) if out.exists() else None
        assert state in (None, {}, complete), where  # absent (or only made), or complete
        ok(cli(*edit(src, out)))  # the rerun removes what the killed run left
        assert body(tree(out)) == complete, where
        assert near(parent) == ["out", "src"], (where, near(parent))


def test_edit_replacing_an_out_killed_at_every_step(tmp_path):
    """An earlier output of episodekit's at --out, replaced by an edit with other options."""
    ref = copy_fixture("vid24", tmp_path / "ref" / "src")
    ok(cli(*edit(ref, ref.parent / "out")))
    shutil.copytree(ref.parent / "out", tmp_path / "old")
    old = body(tree(tmp_path / "old"))
    steps = points(tmp_path, *edit(ref, ref.parent / "out", "--drop-episodes", "9"))
    complete = body(tree(ref.parent / "out"))
    assert complete != old and [s for s in steps if s.startswith("publish:")], steps
    for n, step in enumerate(steps, 1):
        parent = tmp_path / f"KILL-{n}"
        src = copy_fixture("vid24", parent / "src")
        source = tree(src)
        out = parent / "out"
        shutil.copytree(tmp_path / "old", out)
        run = crash("KILL", n, *edit(src, out, "--drop-episodes", "9"))
        where = f"KILL at {n} ({step}): exit {run.returncode}\n{run.stderr}"
        check_exit("KILL", run, where)
        assert tree(src) == source, where
        if out.exists():
            assert body(published(out)) in (old, complete), where  # as it was, or complete
        ok(cli(*edit(src, out, "--drop-episodes", "9")))
        assert body(tree(out)) == complete, where
        assert near(parent) == ["out", "src"], (where, near(parent))
