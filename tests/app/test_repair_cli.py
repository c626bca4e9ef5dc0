"""``episodekit repair`` as a user runs it (a subprocess) on recordings LeRobot 0.6.1 wrote and
that were killed mid-recording: what it prints, its exit codes, and that LeRobot's validator
(ours, ``validate --deep``) passes what it writes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"


def cli(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "episodekit.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
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


# -- issue 48: --restore never throws data away; no hidden leftovers ----------------------------

UNDO = re.compile(r"\(undo: episodekit repair (\S+) --restore (\S+)\)")
HOLD = """
import sys, time
from episodekit.core.lock import writer_lock
with writer_lock(sys.argv[1]):
    print("HELD", flush=True)
    sys.stdin.read()
"""


def in_place(src: Path) -> Path:
    """``repair SRC --in-place``; the backup it names."""
    p = cli("repair", src, "--in-place")
    assert p.returncode == 0, p.stderr
    (found,) = UNDO.findall(p.stdout)
    return Path(found[1])


def test_restore_refuses_files_changed_since_the_repair(tmp_path):
    """Bytes appended after the repair to a file it replaced and to one it created: --restore
    exits 2 naming both, and changes nothing (neither file lost, the backup kept); once they
    are as the repair left them, it restores."""
    src = copy("crash_rec7", tmp_path)
    before = tree(src)
    backup = in_place(src)
    replaced = "data/chunk-000/file-001.parquet"
    created = "meta/episodes/chunk-000/file-001.parquet"
    originals = {rel: (src / rel).read_bytes() for rel in (replaced, created)}
    for rel in (replaced, created):
        with open(src / rel, "ab") as fh:
            fh.write(b"the user's own bytes")
    changed, kept = tree(src), tree(backup)
    line = one_error(cli("repair", src, "--restore", backup), 2)
    assert replaced in line and created in line and "changed since the repair" in line, line
    assert tree(src) == changed and tree(backup) == kept
    for rel, data in originals.items():
        (src / rel).write_bytes(data)
    assert cli("repair", src, "--restore", backup).returncode == 0
    assert tree(src) == before and not backup.exists()


def test_restore_refuses_manifest_paths_outside_the_root(tmp_path):
    """A manifest edited to name a file outside ROOT (``..``, an absolute path, a path through
    a symlink in ROOT), with that file's true hash: refused, the file intact, ROOT unchanged."""
    src = copy("crash_rec7", tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("not episodekit's")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "x.txt").write_text("not episodekit's either")
    (src / "linked").symlink_to(outside)
    backup = in_place(src)
    manifest = json.loads((backup / "manifest.json").read_text())
    for rel, target in (
        ("../victim.txt", victim),
        (str(victim), victim),
        ("linked/x.txt", outside / "x.txt"),
    ):
        edited = dict(manifest, created=[*manifest["created"], rel])
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        edited["after"] = {**manifest["after"], rel: digest}
        (backup / "manifest.json").write_text(json.dumps(edited))
        repaired = tree(src)
        line = one_error(cli("repair", src, "--restore", backup), 2)
        assert rel in line, line
        assert target.exists() and tree(src) == repaired, rel


def test_undo_of_a_symlinked_root_works_as_printed(tmp_path):
    """ROOT given as a symlink: the backup lies next to the real folder, and the undo command
    the run prints works as printed."""
    real = copy("crash_rec7", tmp_path / "disk")
    link = tmp_path / "rec"
    link.symlink_to(real)
    before = tree(real)
    p = cli("repair", link, "--in-place")
    assert p.returncode == 0, p.stderr
    ((root, backup),) = UNDO.findall(p.stdout)
    assert root == str(link) and Path(backup).parent == real.parent
    p = cli("repair", root, "--restore", backup)
    assert p.returncode == 0, p.stderr
    assert tree(real) == before and sorted(os.listdir(real.parent)) == ["crash_rec7"]


def test_two_concurrent_in_place_runs_make_one_backup(tmp_path):
    """Two --in-place runs at once (both queued behind a writer of ROOT): the lock is taken
    before the plan, so one repairs and the other then finds nothing to repair."""
    src = copy("crash_rec7", tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(src)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "HELD"
    argv = [sys.executable, "-m", "episodekit.cli", "repair", str(src), "--in-place"]
    runs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]  # fmt: skip
    for run in runs:  # both wait for the lock
        assert "waiting for another episodekit process" in run.stderr.readline()
    holder.communicate("")
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    said = sorted("nothing to repair" in out for out, _ in outputs)
    assert said == [False, True], outputs
    backups = [p for p in tmp_path.iterdir() if ".episodekit-backup-" in p.name]
    assert len(backups) == 1 and cli("validate", src).returncode == 0


def test_killed_in_place_leaves_no_lock_and_a_half_repair_is_refused(tmp_path):
    """kill -9 while staging: ROOT as it was, not even a lock file in it; kill -9 half-way
    through the replacing: the next --in-place refuses, naming the --restore that puts ROOT
    back, which then works."""
    from episodekit.core.atomic import KILL_HOOK_ENV
    from episodekit.core.crashpoint import CRASH_ENV, LOG_ENV

    src = copy("crash_rec7", tmp_path / "a")
    before = tree(src)
    p = cli("repair", src, "--in-place", env={KILL_HOOK_ENV: "stats.json"})
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert tree(src) == before  # no .episodekit.lock
    log = tmp_path / "points"
    ref = copy("crash_rec7", tmp_path / "ref")
    assert cli("repair", ref, "--in-place", env={LOG_ENV: str(log)}).returncode == 0
    steps = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    n = steps.index("in-place: replace")
    src = copy("crash_rec7", tmp_path / "b")
    p = cli("repair", src, "--in-place", env={CRASH_ENV: f"KILL:{n + 2}"})  # after one file
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert tree(src) not in (before, tree(ref))  # half repaired
    line = one_error(cli("repair", src, "--in-place"), 2)
    (found,) = UNDO.findall(line)
    assert cli("repair", *found[:1], "--restore", found[1]).returncode == 0
    assert tree(src) == before
    assert cli("repair", src, "--in-place").returncode == 0


def test_killed_out_leaves_no_folder(tmp_path):
    """kill -9 while --out is staged: --out does not exist (its lock lives next to it, not in
    it), and the next run leaves nothing but --out next to ROOT."""
    from episodekit.core.atomic import KILL_HOOK_ENV

    src = copy("crash_rec7", tmp_path)
    out = tmp_path / "out"
    p = cli("repair", src, "--out", out, env={KILL_HOOK_ENV: "stats.json"})
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert not out.exists()
    assert cli("repair", src, "--out", out).returncode == 0
    assert sorted(os.listdir(tmp_path)) == ["crash_rec7", "out"]


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
