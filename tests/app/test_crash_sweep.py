"""``kill -9`` and Ctrl-C at every step that changes the disk (issue 48): ``repair --in-place``,
``repair --restore`` and the ``--out`` swap, run as a user runs them, each stopped at its N-th
crash point (core/crashpoint.py: the lock taken and released, the staging folder made and
marked, the backup made, each file kept, replaced, put back or removed, the manifest
completed, the swap, each entry of a folder removed, its marker, the folder), N over every
point a whole run reaches.

After ``kill -9``: ROOT as it was, fully repaired, or restorable (a backup that puts it back,
and a repair that refuses until it is restored); ``--out`` as it was or complete (never a
folder holding only a lock file); no lock file in ROOT; and whatever is left next to them is
removed by the next run. After SIGINT: exit 130 (0 when the run was done), the same states,
and nothing left at all but the backup of a repaired ROOT, named in what the run printed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from episodekit.core import staging
from episodekit.core.crashpoint import CRASH_ENV, LOG_ENV, NO_EXCHANGE_ENV
from tests.app.hostile import cli, copy_fixture, ok, tree

SIGNALS = ["KILL", "INT"]
UNDO = re.compile(r"\(undo: episodekit repair (\S+) --restore (\S+)\)")


def points(tmp: Path, *args, env: dict | None = None) -> list[str]:
    """The crash points an uninterrupted run of ``args`` reaches, in order."""
    log = tmp / "points.log"
    ok(cli(*args, env={**(env or {}), LOG_ENV: str(log)}))
    names = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    log.unlink()
    return names


def crash(sig: str, n: int, *args, env: dict | None = None):
    return cli(*args, env={**(env or {}), CRASH_ENV: f"{sig}:{n}"})


def near(parent: Path) -> list[str]:
    return sorted(os.listdir(parent))


def backups(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if ".episodekit-backup-" in p.name)


def check_exit(sig: str, run, where: str) -> None:
    assert "Traceback" not in run.stderr, where
    if sig == "KILL":
        assert run.returncode == -signal.SIGKILL, where
    else:
        assert run.returncode in (130, 0), where  # 0: the signal came after the work was done


def published(out: Path) -> dict[str, str]:
    """``--out``'s tree but for a staging marker a publish killed at its edges leaves in it
    (hidden; the next run of any writer of ``out`` removes it: checked by the rerun)."""
    return {k: v for k, v in tree(out).items() if k != ".episodekit-staging"}


def undo_printed(run) -> tuple[str, str]:
    """The undo command the run printed (stdout when done, stderr when stopped)."""
    found = UNDO.findall(run.stdout + run.stderr)
    assert found, run.stdout + run.stderr
    return found[-1]


@pytest.mark.parametrize("sig", SIGNALS)
def test_repair_in_place_stopped_at_every_step(tmp_path, sig):
    ref = copy_fixture("crash_rec7", tmp_path / "ref" / "rec")
    before = tree(ref)
    steps = points(tmp_path, "repair", ref, "--in-place")
    repaired = tree(ref)
    assert len(steps) >= 15 and "in-place: replace" in steps, steps
    for n, step in enumerate(steps, 1):
        parent = tmp_path / f"{sig}-{n}"
        root = copy_fixture("crash_rec7", parent / "rec")
        run = crash(sig, n, "repair", root, "--in-place")
        where = f"{sig} at {n} ({step}): exit {run.returncode}\n{run.stderr}"
        check_exit(sig, run, where)
        state = tree(root)
        assert ".episodekit.lock" not in state, where
        if sig == "INT":
            if state == before:
                assert near(parent) == ["rec"], where  # nothing left next to it
                continue
            assert state == repaired, where  # never half repaired
            (backup,) = backups(parent)
            assert near(parent) == sorted(["rec", backup.name]), where
            root_arg, backup_arg = undo_printed(run)  # named on every way out
            assert Path(backup_arg) == backup, where
            ok(cli("repair", root_arg, "--restore", backup_arg))  # works as printed
            assert tree(root) == before and near(parent) == ["rec"], where
            continue
        found = backups(parent)
        if state not in (before, repaired):  # half repaired: restorable, and said so
            assert len(found) == 1, where
            refused = cli("repair", root, "--in-place")
            assert refused.returncode == 2 and "--restore" in refused.stderr, refused.stderr
        for backup in found:
            ok(cli("repair", root, "--restore", backup))
        assert tree(root) == before, where
        ok(cli("repair", root, "--in-place"))  # removes what the killed run left
        assert tree(root) == repaired, where
        assert len(backups(parent)) == 1 and len(near(parent)) == 2, (where, near(parent))


@pytest.mark.parametrize("sig", SIGNALS)
def test_repair_restore_stopped_at_every_step(tmp_path, sig):
    ref = copy_fixture("crash_rec7", tmp_path / "ref" / "rec")
    before = tree(ref)
    ok(cli("repair", ref, "--in-place"))
    repaired = tree(ref)
    steps = points(tmp_path, "repair", ref, "--restore", backups(ref.parent)[0])
    assert "restore: back" in steps and "backup: retire" in steps, steps
    for n, step in enumerate(steps, 1):
        parent = tmp_path / f"{sig}-{n}"
        root = copy_fixture("crash_rec7", parent / "rec")
        ok(cli("repair", root, "--in-place"))
        (backup,) = backups(parent)
        run = crash(sig, n, "repair", root, "--restore", backup)
        where = f"{sig} at {n} ({step}): exit {run.returncode}\n{run.stderr}"
        check_exit(sig, run, where)
        state = tree(root)
        assert ".episodekit.lock" not in state, where
        if sig == "INT":
            if state == repaired:
                assert near(parent) == sorted(["rec", backup.name]), where  # the backup, intact
                ok(cli("repair", root, "--restore", backup))
            assert tree(root) == before and near(parent) == ["rec"], where
            continue
        if backup.exists():  # killed before it was retired: restoring again finishes
            ok(cli("repair", root, "--restore", backup))
        assert tree(root) == before, where
        ok(cli("repair", root, "--in-place"))  # removes what the killed run left
        assert len(backups(parent)) == 1 and len(near(parent)) == 2, (where, near(parent))


@pytest.mark.parametrize(
    "sig,exchange", [("KILL", True), ("INT", True), ("KILL", False)],
    ids=["KILL", "INT", "KILL-two-renames"],
)  # fmt: skip
def test_repair_out_swap_stopped_at_every_step(tmp_path, sig, exchange):
    """An existing --out replaced (the same source with --keep-partial: another key)."""
    env = {} if exchange else {NO_EXCHANGE_ENV: "1"}
    ref = copy_fixture("crash_rec7", tmp_path / "ref" / "rec")
    ok(cli("repair", ref, "--out", ref.parent / "out"))
    shutil.copytree(ref.parent / "out", tmp_path / "old")
    steps = points(tmp_path, "repair", ref, "--out", ref.parent / "out", "--keep-partial", env=env)
    shutil.rmtree(ref.parent / "out")
    os.rename(tmp_path / "old", ref.parent / "out")
    source = tree(copy_fixture("crash_rec7", tmp_path / "pristine"))
    assert [s for s in steps if s.startswith("publish:")], steps
    for n, step in enumerate(steps, 1):
        parent = tmp_path / f"{sig}-{exchange}-{n}"
        src = copy_fixture("crash_rec7", parent / "rec")
        out = parent / "out"
        args = ("repair", src, "--out", out, "--keep-partial")
        shutil.copytree(ref.parent / "out", out)  # an earlier output (of a root elsewhere)
        old = tree(out)
        run = crash(sig, n, *args, env=env)
        where = f"{sig} at {n} ({step}): exit {run.returncode}\n{run.stderr}"
        check_exit(sig, run, where)
        assert tree(src) == source, where  # --out never writes into the source
        if not exchange and not out.exists():  # killed between the two renames: the next
            staging.remove_stale(out)  # run (its clean-up) puts the replaced output back
            assert tree(out) == old, where
        state = published(out)
        if sig == "INT":
            assert near(parent) == ["out", "rec"], where  # nothing left next to it
        ok(cli(*args))  # (the rerun also removes what a killed run left)
        new = tree(out)
        assert state in (old, new) and old != new, where  # as it was, or complete
        assert near(parent) == ["out", "rec"], (where, near(parent))


@pytest.mark.parametrize("sig", SIGNALS)
def test_repair_new_out_stopped_at_every_step(tmp_path, sig):
    ref = copy_fixture("crash_rec7", tmp_path / "ref" / "rec")
    source = tree(ref)
    steps = points(tmp_path, "repair", ref, "--out", ref.parent / "out")
    assert tree(ref) == source
    for n, step in enumerate(steps, 1):
        parent = tmp_path / f"{sig}-{n}"
        src = copy_fixture("crash_rec7", parent / "rec")
        out = parent / "out"
        run = crash(sig, n, "repair", src, "--out", out)
        where = f"{sig} at {n} ({step}): exit {run.returncode}\n{run.stderr}"
        check_exit(sig, run, where)
        assert tree(src) == source, where  # --out never writes into the source
        state = published(out) if out.exists() else None
        if sig == "INT":
            assert near(parent) in (["rec"], ["out", "rec"]), where
        ok(cli("repair", src, "--out", out))
        assert state in (None, tree(out)), where  # absent, or complete
        assert near(parent) == ["out", "rec"], (where, near(parent))
