"""core/staging.py: staging folders that can never be a user's, clean-up by marker only, and a
publish that leaves the final name old or new (the exchange and the two-rename fallback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from episodekit.core import staging
from episodekit.core.errors import EnvironmentProblem


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(proc.stdout)


def _orphan(out: Path, kind: str = "partial") -> Path:
    """A staging folder of a writer that died (its marker names a gone pid)."""
    token = uuid.uuid4().hex
    p = staging.staging_path(out, kind, token)
    p.mkdir()
    doc = {"token": token, "out": out.name, "pid": _dead_pid(), "host": os.uname().nodename}
    (p / staging.STAGING_MARKER).write_text(json.dumps(doc))
    return p


def test_only_marked_folders_of_dead_writers_are_removed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()  # (missing, a dead writer's "old" folder would be put back: a test below)
    dead = [_orphan(out), _orphan(out, "old")]
    live = staging.new_staging(out)  # this process: alive
    lookalikes = [
        tmp_path / f".out.episodekit-partial-{uuid.uuid4().hex}",  # no marker
        tmp_path / "out.partial-1",
        tmp_path / "out.old-2",
        tmp_path / f".other.episodekit-partial-{uuid.uuid4().hex}",
    ]
    for p in lookalikes:
        p.mkdir()
        (p / "notes.txt").write_text("mine")
    wrong = _orphan(out)
    (wrong / staging.STAGING_MARKER).write_text(
        json.dumps({"token": "0" * 32, "out": "out", "pid": _dead_pid()})
    )  # a marker copied from elsewhere: its token is not the folder's
    # our exact name holding nothing (or an empty marker): a run killed between its mkdir and
    # its marker's write; nothing of anyone's is in it
    empty = [staging.staging_path(out, "partial", uuid.uuid4().hex) for _ in range(2)]
    for p in empty:
        p.mkdir()
    (empty[1] / staging.STAGING_MARKER).write_text("")
    assert sorted(staging.remove_stale(out)) == sorted(dead + empty)
    assert live.is_dir() and wrong.is_dir() and all(p.is_dir() for p in lookalikes)


def test_a_symlink_named_like_staging_is_never_followed(tmp_path):
    out = tmp_path / "out"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("x")
    orphan = _orphan(out)
    link = staging.staging_path(out, "old", uuid.uuid4().hex)
    link.symlink_to(orphan)
    assert not staging.owned(link, out)
    staging.remove_stale(out)
    assert link.is_symlink() and (victim / "keep.txt").exists()


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_publish_replaces_the_output_and_cleans_up(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(staging, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    for n in range(3):  # first publish (out missing), then replacements
        work = staging.new_staging(out)
        (work / "n.txt").write_text(str(n))
        staging.publish(work, out)
        assert (out / "n.txt").read_text() == str(n)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
        assert not (out / staging.STAGING_MARKER).exists()


def test_publish_refuses_a_folder_that_is_not_staging(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ValueError, match="not a staging folder"):
        staging.publish(other, tmp_path / "out")
    assert other.is_dir()


def test_seed_links_only_what_is_asked_and_never_the_writers_files(tmp_path):
    out = tmp_path / "out"
    (out / "data/chunk-000").mkdir(parents=True)
    (out / "data/chunk-000/file-000.parquet").write_text("a")
    (out / "meta").mkdir()
    (out / "meta/info.json").write_text("{}")
    (out / ".episodekit.lock").write_text("")
    work = staging.new_staging(out)
    assert staging.seed_from(out, work, only={"data/chunk-000/file-000.parquet"}) == 1
    linked = work / "data/chunk-000/file-000.parquet"
    assert linked.stat().st_ino == (out / "data/chunk-000/file-000.parquet").stat().st_ino
    assert not (work / "meta").exists() and not (work / ".episodekit.lock").exists()
    assert staging.seed_from(out, work) == 1  # the rest: info.json (the link exists already)


def test_a_mount_point_output_is_refused_before_any_work(tmp_path):
    probe = subprocess.run(
        ["unshare", "-rm", "true"], capture_output=True
    ) if os.path.exists("/usr/bin/unshare") else None  # fmt: skip
    if probe is None or probe.returncode != 0:
        pytest.skip("no private mount namespace here")
    out = tmp_path / "out"
    out.mkdir()
    code = (
        "import sys; from episodekit.core import staging\n"
        "try:\n    staging.new_staging(sys.argv[1])\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    script = f"mount -t tmpfs tmpfs {out} && {sys.executable} -c '{code}' {out}"
    got = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True)
    assert got.stdout.startswith(EnvironmentProblem.__name__) and "mount point" in got.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_seed_never_links_what_it_is_told_to_skip(tmp_path):
    out = tmp_path / "out"
    (out / "meta").mkdir(parents=True)
    (out / "meta/info.json").write_text("{}")
    (out / "meta/gone.json").write_text("{}")  # a copy of a source file the source lost
    work = staging.new_staging(out)
    assert staging.seed_from(out, work, skip={"meta/gone.json"}) == 1
    assert (work / "meta/info.json").is_file() and not (work / "meta/gone.json").exists()


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_a_signal_in_the_swap_is_raised_once_the_new_output_is_in(tmp_path, monkeypatch, exchange):
    """Ctrl-C right after the replaced output is moved aside (two renames: ``out`` is missing
    until the second) is raised only when the swap is done: ``out`` holds the new output, the
    replaced one is gone, the run is still 130."""
    import signal
    import time

    from episodekit.core import interrupt

    out = tmp_path / "out"
    out.mkdir()
    (out / "n.txt").write_text("old")
    real_exchange, real_rename = staging._exchange, os.rename

    def signal_self() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handler runs here: deferred, or raised where a swap is cut

    def exchange_then_signal(a, b):
        done = real_exchange(a, b)
        signal_self()
        return done

    def rename_then_signal(a, b):
        real_rename(a, b)
        if Path(a) == out:  # the first of the two renames: out is missing now
            signal_self()

    if exchange:
        monkeypatch.setattr(staging, "_exchange", exchange_then_signal)
    else:
        monkeypatch.setattr(staging, "_exchange", lambda a, b: False)
        monkeypatch.setattr(staging.os, "rename", rename_then_signal)
    work = staging.new_staging(out)
    (work / "n.txt").write_text("new")
    reached = []

    def body() -> int:
        staging.publish(work, out)
        reached.append("after publish")
        return 0

    assert interrupt.run_command(body) == 130
    assert not reached  # the signal was raised, at the end of the swap
    assert (out / "n.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the replaced output is gone


def test_a_backup_is_never_stale(tmp_path):
    """A backup (an in-place repair's way back) of a writer long gone stays: only a restore
    removes it; it is ours by name and marker, and never a staging folder to publish."""
    out = tmp_path / "out"
    out.mkdir()
    backup = _orphan(out, "backup")
    dead = _orphan(out)
    assert staging.remove_stale(out) == [dead]
    assert backup.is_dir() and staging.is_backup(backup, out) and staging.owned(backup, out)
    assert not staging.is_backup(dead, out)
    with pytest.raises(ValueError, match="not a staging folder"):
        staging.publish(backup, out)
    made = staging.new_backup(out)
    assert made.name.startswith(".out.episodekit-backup-") and staging.is_backup(made, out)


def test_a_removal_cut_short_leaves_the_folder_marked(tmp_path, monkeypatch):
    """Whatever entry a removal is cut at (a signal, an error), the folder left still holds
    its marker, and the next run removes it once its writer is gone (issue 48)."""
    out = tmp_path / "out"
    real_unlink = os.unlink
    for cut in range(1, 12):
        work = staging.new_staging(out)
        for i in range(8):
            (work / f"f{i}.bin").write_text("x")
            (work / f"d{i}").mkdir()
            (work / f"d{i}" / "g").write_text("y")
        calls = []

        def unlink(path, *args, cut=cut, calls=calls, **kwargs):
            calls.append(path)
            if len(calls) == cut:
                raise KeyboardInterrupt
            return real_unlink(path, *args, **kwargs)

        monkeypatch.setattr(os, "unlink", unlink)
        with pytest.raises(KeyboardInterrupt):
            staging.discard(work, out)
        monkeypatch.setattr(os, "unlink", real_unlink)
        assert work.is_dir() and (work / staging.STAGING_MARKER).is_file(), cut
        doc = json.loads((work / staging.STAGING_MARKER).read_text())
        doc["pid"] = _dead_pid()  # its writer gone
        (work / staging.STAGING_MARKER).write_text(json.dumps(doc))
        assert staging.remove_stale(out) == [work]


def test_a_folder_whose_pid_was_reused_is_removed(tmp_path):
    """A killed writer's pid now belongs to another live process (started at another time):
    its folder goes; a live writer's stays (core/spill.py's owner record)."""
    out = tmp_path / "out"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        reused = staging.new_staging(out)
        doc = json.loads((reused / staging.STAGING_MARKER).read_text())
        doc.update(pid=other.pid, start="1")  # that pid, but not the process that wrote it
        (reused / staging.STAGING_MARKER).write_text(json.dumps(doc))
        live = staging.new_staging(out)
        doc = json.loads((live / staging.STAGING_MARKER).read_text())
        (live / staging.STAGING_MARKER).write_text(json.dumps(dict(doc, pid=other.pid,
                                                                   start=None)))  # fmt: skip
        assert staging.remove_stale(out) == [reused] and live.is_dir()
    finally:
        other.kill()
        other.wait()


def test_an_output_moved_aside_by_a_killed_two_rename_publish_is_put_back(tmp_path):
    """Where there is no exchange, a publish killed between its two renames leaves ``out``
    missing and the old output under a marked name: the next run puts it back, as it was."""
    out = tmp_path / "out"
    old = _orphan(out, "old")  # the replaced output, marked by the swap, its writer gone
    (old / "n.txt").write_text("old")
    staging.remove_stale(out)
    assert (out / "n.txt").read_text() == "old" and sorted(os.listdir(out)) == ["n.txt"]
    assert os.listdir(tmp_path) == ["out"]


def test_a_killed_writers_lock_file_goes_with_its_staging_folder(tmp_path):
    """A run killed while writing its staging folder leaves the folder and, next to it, the
    folder's (empty, unheld) lock file: the next run's clean-up removes both. A lock file of
    a folder that is not removed, or one still held, stays."""
    from episodekit.core.lock import lock_path

    out = tmp_path / "out"
    out.mkdir()
    dead = _orphan(out)
    code = (
        "import os, sys; from episodekit.core.lock import writer_lock\n"
        "with writer_lock(sys.argv[1]):\n    os.kill(os.getpid(), 9)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(dead)], check=False)
    assert lock_path(dead).is_file()  # what kill -9 leaves
    live = staging.new_staging(out)
    lock_path(live).write_text("")  # not removed with its folder: stays
    assert staging.remove_stale(out) == [dead]
    assert not lock_path(dead).exists()
    assert lock_path(live).is_file()
