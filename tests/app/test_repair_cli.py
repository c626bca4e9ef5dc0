"""``episodekit repair`` as a user runs it (a subprocess) on recordings LeRobot 0.6.1 wrote and
that were killed mid-recording: what it prints, its exit codes, and that LeRobot's validator
(ours, ``validate --deep``) passes what it writes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "episodekit.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def copy(name: str, tmp: Path) -> Path:
    shutil.copytree(FIXTURES / name, tmp / name)
    return tmp / name


def tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def one_error(p: subprocess.CompletedProcess, code: int) -> str:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


def test_repair_then_validate_deep(tmp_path):
    src = copy("crash_vid5", tmp_path)
    p = cli("validate", src)
    assert p.returncode == 1 and f"episodekit repair {src} --dry-run" in p.stdout, p.stdout
    out = tmp_path / "out"
    p = cli("repair", src, "--out", out)
    assert p.returncode == 0, p.stderr
    for line in (
        "no parquet footer (its writer was never closed): 5 whole row groups, 31 rows recovered",
        "kept 5 episodes (31 frames); metadata rebuilt for episode(s) 4",
        "left behind: 8 PNG files of the episode being recorded",
        f"wrote {out} in",
    ):
        assert line in p.stdout, p.stdout
    p = cli("validate", out, "--deep")
    assert p.returncode == 0, p.stdout + p.stderr
    p = cli("repair", src, "--out", out)
    assert p.returncode == 0 and "already repaired" in p.stdout, p.stdout


def test_rollover_crash_is_repaired_and_validates(tmp_path):
    """Every file has a footer (the recorder died right after the data file rolled over), yet
    four metadata rows are missing: repair says so and rebuilds them; validate passes after."""
    src = copy("crash_rollover", tmp_path)
    assert cli("validate", src).returncode == 1
    p = cli("repair", src, "--dry-run", "--json")
    d = json.loads(p.stdout)
    assert p.returncode == 0 and d["status"] == "planned" and d["rebuilt"] == [10, 11, 12, 13]
    out = tmp_path / "out"
    p = cli("repair", src, "--out", out)
    assert p.returncode == 0, p.stderr
    assert "1 damage(s) found" in p.stdout and "no metadata row for episodes 10-13" in p.stdout
    p = cli("validate", out, "--deep")
    assert p.returncode == 0, p.stdout + p.stderr
    p = cli("repair", out, "--dry-run")
    assert p.returncode == 0 and "nothing to repair" in p.stdout, p.stdout


def test_json_and_dry_run(tmp_path):
    src = copy("crash_vid3_saving", tmp_path)
    before = tree(tmp_path)
    p = cli("repair", src, "--dry-run", "--json")
    assert p.returncode == 0 and not p.stderr, p.stderr
    d = json.loads(p.stdout)
    assert d["status"] == "planned" and d["episodes"] == 3 and d["rebuilt"] == [2]
    assert d["dropped"][0]["episode"] == 3 and "--keep-partial" in d["dropped"][0]["reason"]
    assert tree(tmp_path) == before
    p = cli("repair", src, "--dry-run")
    assert "dry run: nothing written" in p.stdout and "dropped episode 3 (4 frames" in p.stdout


def test_in_place_and_restore(tmp_path):
    src = copy("crash_rec7", tmp_path)
    before = tree(src)
    p = cli("repair", src, "--in-place")
    assert p.returncode == 0, p.stderr
    (backup,) = tmp_path.glob(".crash_rec7.episodekit-backup-*")  # hidden, as staging folders
    assert (backup / ".episodekit-staging").is_file()  # marked as episodekit's
    assert f"are in {backup} (undo: episodekit repair {src} --restore {backup})" in p.stdout
    assert cli("validate", src, "--deep").returncode == 0
    p = cli("repair", src, "--in-place")
    assert p.returncode == 0 and "nothing to repair" in p.stdout
    p = cli("repair", src, "--restore", backup)
    assert p.returncode == 0, p.stderr
    assert tree(src) == before


def test_exit_codes(tmp_path):
    healthy = copy("rec40", tmp_path)
    p = cli("repair", healthy, "--out", tmp_path / "o1")
    assert p.returncode == 0 and "nothing to repair" in p.stdout and not (tmp_path / "o1").exists()
    src = copy("crash_rec7", tmp_path)
    assert "--out DIR" in one_error(cli("repair", src), 2)
    assert "not both" in one_error(cli("repair", src, "--out", tmp_path / "o", "--in-place"), 2)
    for inside in (src, src / "o", tmp_path):  # the one output-folder rule, with its words
        assert "the source dataset" in one_error(cli("repair", src, "--out", inside), 2)
    assert sorted(p.name for p in src.iterdir()) == ["data", "meta"]  # not even a lock
    assert "--restore" in one_error(cli("repair", src, "--restore", tmp_path, "--in-place"), 2)
    assert "not a repair backup" in one_error(cli("repair", src, "--restore", tmp_path), 2)
    lost = copy("crash_vid5", tmp_path)
    (lost / "data/chunk-000/file-000.parquet").write_bytes(b"PAR1")
    shutil.rmtree(lost / "meta/episodes")
    assert "no episode can be recovered" in one_error(cli("repair", lost, "--dry-run"), 1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_in_place_signalled_at_any_moment(tmp_path, sig):
    """``repair --in-place`` signalled at a spread of moments (imports, inspection, staging,
    verification, the replacing, the summary): it exits 128 + signal (or 0 when it had
    finished), and ROOT is either as it was, with nothing left next to it, or fully repaired,
    with one backup that puts it back. (The replacing itself, too short to hit from outside:
    tests/writers/test_repair.py.)"""
    from tests.app.test_signals import signal_at, start

    def files(root: Path) -> dict[str, str]:
        return {k: v for k, v in tree(root).items() if k != ".episodekit.lock"}

    before = files(FIXTURES / "crash_vid5")
    full = copy("crash_vid5", tmp_path / "full")
    t0 = time.monotonic()
    proc = start(["repair", str(full), "--in-place"], dict(os.environ))
    stdout, stderr = proc.communicate(timeout=300)
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, stderr
    repaired = files(full)
    outcomes = set()
    for i, f in enumerate((0.05, 0.2, 0.4, 0.6, 0.8, 0.95)):
        src = copy("crash_vid5", tmp_path / str(i))
        args = ["repair", str(src), "--in-place"]
        run = signal_at(args, f * seconds, sig, "repaired ", dict(os.environ))
        where = f"signalled at {f:.2f} x {seconds:.1f} s: exit {run.code}\n{run.stderr}"
        assert run.code == 128 + sig or (run.done_before and run.code in (0, -sig)), where
        assert "Traceback" not in run.stderr and not run.left, where
        near = sorted(p.name for p in src.parent.iterdir() if p != src)
        if files(src) == before:
            assert near == [], where  # no staging folder, no backup
            outcomes.add("as before")
            continue
        assert files(src) == repaired, f"{where}: ROOT half repaired"
        assert len(near) == 1 and ".crash_vid5.episodekit-backup-" in near[0], where
        backup = src.parent / near[0]
        assert cli("repair", src, "--restore", backup).returncode == 0
        assert files(src) == before and not backup.exists(), where
        outcomes.add("repaired")
    assert "as before" in outcomes  # most moments came before the replacing


FULL_DISK = (
    "import errno, sys\n"
    "from episodekit.core import parquet_salvage as ps\n"
    "def full(src, dst, *a, **k):\n"
    "    raise OSError(errno.ENOSPC, 'No space left on device', str(dst))\n"
    "ps.write_salvaged = full\n"
    "from episodekit.cli import main\n"
    "sys.argv = ['episodekit', *sys.argv[1:]]\n"
    "main()\n"
)


def test_full_disk_says_nothing_was_published(tmp_path):
    """The disk fills while the repaired files are staged: one line naming the file under
    --out DIR it was going to be (never the hidden staging folder) and that nothing was
    published (--out) or changed (--in-place); exit 2; nothing left behind."""
    src = copy("crash_rec7", tmp_path)
    before = tree(src)
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-c", FULL_DISK, "repair", src, "--out", out],
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = one_error(p, 2)
    assert f"{out}/data/chunk-000/file-001.parquet: cannot write: " in line, line
    assert line.endswith(f"(nothing was published to {out})"), line
    assert ".episodekit-partial" not in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["crash_rec7"]
    p = subprocess.run(
        [sys.executable, "-c", FULL_DISK, "repair", src, "--in-place"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = one_error(p, 2)
    assert f"{src}/data/chunk-000/file-001.parquet: cannot write: " in line, line
    assert line.endswith(f"({src} was not changed)") and ".episodekit-" not in p.stderr, line
    assert {k: v for k, v in tree(src).items() if k != ".episodekit.lock"} == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["crash_rec7"]


def test_validate_before_the_first_metadata_flush_names_the_open_data_file(tmp_path):
    """Killed before the recorder flushed any meta/episodes row (no episodes file, the data
    file without footer): validate names that data file and the repair command to run, whose
    option exists; run as printed, it gives a root that validates."""
    src = copy("crash_vid5", tmp_path)
    shutil.rmtree(src / "meta/episodes")  # as a crash before the first flush leaves it
    p = cli("validate", src)
    assert p.returncode == 1
    hint = f"`episodekit repair {src} --out DIR`"
    assert "data/chunk-000/file-000.parquet has no parquet footer" in p.stdout, p.stdout
    assert hint in p.stdout, p.stdout
    assert "--out DIR" in cli("repair", "--help").stdout
    out = tmp_path / "out"
    p = cli("repair", src, "--out", out)
    assert p.returncode == 0, p.stderr
    assert "no episodes file (the recorder never flushed one): the metadata rows of episodes " \
        "0-4 rebuilt" in p.stdout, p.stdout  # fmt: skip
    p = cli("validate", out, "--deep")
    assert p.returncode == 0, p.stdout + p.stderr
