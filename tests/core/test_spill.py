"""Spill folders (core/spill.py): a stats pass killed with SIGKILL leaves its temporary folders
behind, marked with their owner; the next run removes exactly those whose owner is provably
gone (dead, zombie, pid reused, machine restarted) and nothing else: a look-alike without our
marker, a live run's folder (another process's or this one's), another host's, a link, a
folder it may not remove (the run goes on)."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from episodekit.core.atomic import KILL_HOOK_ENV
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.spill import (
    PREFIXES,
    SPILL_MARKER,
    owner_gone,
    owner_record,
    read_marker,
    remove_stale,
    spill_folder,
)
from episodekit.metadata.stats import compute_stats
from tests.app.hostile import cli, copy_fixture, ok

DROP = "-dac_override,-dac_read_search,-fowner"
SETPRIV = ["setpriv", "--bounding-set", DROP, "--inh-caps", DROP]

# A stats pass that kills itself (SIGKILL) where all three of its spill folders exist: right
# before the exact selection over the spilled runs.
KILLED_PASS = """
import os, signal, sys
import episodekit.metadata.stats.compute as compute
compute.exact_from_runs = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
compute.compute_stats(sys.argv[1], jobs=1, spill_dir=sys.argv[2])
"""
# A process holding a spill folder until its stdin closes (prints the folder first).
HOLDER = """
import sys
from episodekit.core.spill import spill_folder
with spill_folder(sys.argv[1], sys.argv[2]) as path:
    print(path, flush=True)
    sys.stdin.read()
"""
PASS = """
import sys
from episodekit.metadata.stats import compute_stats
compute_stats(sys.argv[1], jobs=1, spill_dir=sys.argv[2])
"""


def python(code: str, *args, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*(prefix or []), sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def ours(folder: Path) -> list[str]:
    """The names in ``folder`` that have one of the spill prefixes."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(PREFIXES))


def marked(folder: Path, doc: dict, name: str) -> Path:
    """A folder ``name`` in ``folder`` with a marker holding ``doc`` and a file of data."""
    p = folder / name
    p.mkdir()
    (p / SPILL_MARKER).write_text(json.dumps(doc))
    (p / "0.npy").write_bytes(b"data")
    return p


def dead_record() -> dict:
    """The owner record of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    doc = owner_record(proc.pid)
    proc.stdin.close()
    proc.wait()
    return doc


@pytest.fixture
def holder():
    """holder(prefix, parent) -> (process, its live spill folder); closed at the end."""
    procs = []

    def start(prefix: str, parent: Path) -> tuple[subprocess.Popen, Path]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, prefix, str(parent)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc, Path(proc.stdout.readline().strip())

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=60)


def test_a_killed_stats_pass_leaves_marked_folders_that_the_next_run_removes(
    small_root, tmp_path, caplog
):
    spill = tmp_path / "spill"
    spill.mkdir()
    killed = python(KILLED_PASS, small_root, spill)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = ours(spill)
    assert sorted(n.rsplit("-", 1)[0] + "-" for n in left) == sorted(PREFIXES)
    pids = {read_marker(str(spill / n))["pid"] for n in left}
    assert len(pids) == 1 and pids != {os.getpid()}  # the killed child's

    with caplog.at_level(logging.INFO, logger="episodekit.core.spill"):
        res = compute_stats(small_root, jobs=1, spill_dir=str(spill))
    assert not set(left) & set(ours(spill))
    assert [r.getMessage().count("removed 3 temporary folder") for r in caplog.records] == [1]
    del res  # its per-episode stats and sketches live in folders it owns
    gc.collect()
    assert ours(spill) == []


def test_a_killed_cli_run_is_cleaned_by_the_next_one(tmp_path):
    root = copy_fixture("rec40", tmp_path / "root")
    spill = tmp_path / "tmpdir"
    spill.mkdir()
    env = {"TMPDIR": str(spill)}
    killed = cli("metadata", "stats", root, env={**env, KILL_HOOK_ENV: "stats.json"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = ours(spill)
    assert left and all(read_marker(str(spill / n)) for n in left)
    ok(cli("metadata", "stats", root, env=env))
    assert ours(spill) == []


def test_only_marked_folders_of_gone_owners_are_removed(tmp_path, holder):
    spill = tmp_path / "spill"
    spill.mkdir()
    live_proc, live = holder("episodekit-sketches-", spill)
    dead = dead_record()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    marked(outside, dead, "episodekit-stats-target")

    gone = {
        "dead": marked(spill, dead, "episodekit-stats-dead"),
        "reused": marked(
            spill, {**owner_record(live_proc.pid), "start": "1"}, "episodekit-stats-r"
        ),
        "rebooted": marked(
            spill, {**owner_record(), "boot": "another-boot"}, "episodekit-sketches-b"
        ),
        "link inside": marked(spill, dead, "episodekit-episode-stats-l"),
    }
    (gone["link inside"] / "link").symlink_to(outside)
    (gone["link inside"] / "file-link").symlink_to(outside / "keep.txt")
    look_alike = spill / "episodekit-stats-mine"
    look_alike.mkdir()
    (look_alike / "notes.txt").write_text("mine")
    stay = {
        "live": live,
        "this process": marked(spill, owner_record(), "episodekit-stats-self"),
        "look-alike": look_alike,
        "bad marker": marked(spill, dead, "episodekit-stats-bad"),
        "no pid": marked(spill, {**dead, "pid": None}, "episodekit-stats-nopid"),
        "other host": marked(spill, {**dead, "host": "elsewhere"}, "episodekit-stats-host"),
        "other pidns": marked(spill, {**dead, "pidns": "pid:[1]"}, "episodekit-stats-ns"),
        "other prefix": marked(spill, dead, "episodekit-other-x"),
        "marker link": spill / "episodekit-stats-mlink",
        "link": spill / "episodekit-stats-link",
    }
    (stay["bad marker"] / SPILL_MARKER).write_text('{"pid": ')
    stay["marker link"].mkdir()
    (stay["marker link"] / SPILL_MARKER).symlink_to(
        outside / "episodekit-stats-target" / SPILL_MARKER
    )
    stay["link"].symlink_to(outside / "episodekit-stats-target")
    before = {k: sorted(p.rglob("*")) for k, p in stay.items()}

    with spill_folder("episodekit-stats-", spill) as path:
        mine = Path(path)
        assert read_marker(path)["pid"] == os.getpid()
        for what, p in gone.items():
            assert not p.exists(), what
        for what, p in stay.items():
            assert sorted(p.rglob("*")) == before[what], what
        assert (outside / "keep.txt").read_text() == "mine"
        assert (outside / "episodekit-stats-target" / "0.npy").exists()
    assert not mine.exists()
    assert live.is_dir() and live_proc.poll() is None


def test_a_zombie_owner_is_gone_and_a_live_one_is_not():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    doc = owner_record(proc.pid)
    assert not owner_gone(doc)
    proc.kill()  # not reaped yet: a zombie holding its pid
    deadline = time.monotonic() + 30
    while not owner_gone(doc) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert owner_gone(doc)
    proc.wait()
    assert owner_gone(doc)
    assert not owner_gone(owner_record())


def test_concurrent_runs_keep_each_others_folders(small_root, tmp_path, holder):
    spill = tmp_path / "spill"
    spill.mkdir()
    held = [holder(p, spill) for p in PREFIXES]
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", PASS, str(small_root), str(spill)], stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    for proc in runs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
        proc.stderr.close()
    remove_stale(spill)
    assert ours(spill) == sorted(path.name for _, path in held)
    for proc, _ in held:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert ours(spill) == []


def test_a_holder_killed_by_sigkill_leaves_its_folder_to_the_next_run(tmp_path, holder):
    spill = tmp_path / "spill"
    spill.mkdir()
    proc, path = holder("episodekit-episode-stats-", spill)
    proc.kill()
    proc.wait()
    assert path.is_dir() and read_marker(str(path))["pid"] == proc.pid
    assert remove_stale(spill) == [str(path)]
    assert remove_stale(spill) == []  # idempotent


def _no_override(tmp_path: Path) -> list[str]:
    """The command prefix that makes directory permissions hold (root ignores them)."""
    if os.geteuid() != 0:
        return []
    probe = tmp_path / "probe"
    probe.mkdir(mode=0o555)
    try:
        if (
            shutil.which("setpriv") is None
            or python(
                "open(__import__('sys').argv[1], 'w')", probe / "x", prefix=SETPRIV
            ).returncode
            == 0
        ):
            pytest.skip("running as root and setpriv cannot drop dac_override here")
    finally:
        probe.chmod(0o755)
    return SETPRIV


def test_a_stale_folder_that_cannot_be_removed_does_not_stop_the_run(small_root, tmp_path):
    prefix = _no_override(tmp_path)
    spill = tmp_path / "spill"
    spill.mkdir()
    stuck = marked(spill, dead_record(), "episodekit-stats-stuck")
    stuck.chmod(0o555)  # its file cannot be unlinked, so neither can it
    try:
        run = python(PASS, small_root, spill, prefix=prefix)
    finally:
        stuck.chmod(0o755)
    assert run.returncode == 0, run.stderr
    assert ours(spill) == [stuck.name] and (stuck / "0.npy").exists()


def test_a_read_only_spill_dir_is_one_clear_error(small_root, tmp_path):
    prefix = _no_override(tmp_path)
    spill = tmp_path / "spill"
    spill.mkdir()
    marked(spill, dead_record(), "episodekit-stats-stale")
    spill.chmod(0o555)
    code = (
        "import sys\nfrom episodekit.core.spill import spill_folder\n"
        "from episodekit.core.errors import EnvironmentProblem\n"
        "try:\n    spill_folder('episodekit-stats-', sys.argv[1])\n"
        "except EnvironmentProblem as e:\n    print(e)\n"
    )
    try:
        run = python(code, spill, prefix=prefix)
    finally:
        spill.chmod(0o755)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"{spill}: cannot create a temporary folder: Permission denied"
    assert ours(spill) == ["episodekit-stats-stale"]


def test_the_folder_goes_on_errors_and_interrupts(tmp_path):
    for exc in (ValueError, KeyboardInterrupt):
        with pytest.raises(exc), spill_folder("episodekit-sketches-", tmp_path) as path:
            assert Path(path, SPILL_MARKER).is_file()
            raise exc()
        assert not Path(path).exists()
    with pytest.raises(ValueError, match="prefix"):
        spill_folder("mine-", tmp_path)
    with pytest.raises(EnvironmentProblem, match="cannot create a temporary folder"):
        spill_folder("episodekit-stats-", tmp_path / "missing")
