"""A killed ``episodekit import`` (``kill -9``, the CLI as a subprocess) then rerun: nothing is
published while it is unfinished, the rerun keeps the episodes of the data files the killed run
finished and verified (not writing them again), and its output is the same bytes as an import
never interrupted. The source: 40 small ALOHA episodes written here with h5py; ``--data-mb
0.05`` makes a data file (a checkpoint) every few episodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest

from episodekit.core.crashpoint import CRASH_ENV, LOG_ENV
from tests.app.hostile import cli as ek

SMALL = ["--fps", "50", "--data-mb", "0.05", "--json"]
CHECKPOINT = "import: checkpoint"


def write_source(folder: Path, episodes: int = 40, steps: int = 20) -> Path:
    """ALOHA's record_episodes.py layout, seeded: qpos, qvel, action (14), two raw cameras."""
    folder.mkdir()
    for e in range(episodes):
        rng = np.random.default_rng(e)
        with h5py.File(folder / f"episode_{e}.hdf5", "w") as root:
            root.attrs["sim"] = False
            root.attrs["compress"] = False
            obs = root.create_group("observations")
            images = obs.create_group("images")
            for cam in ("cam_high", "cam_left_wrist"):
                images.create_dataset(cam, data=rng.integers(0, 255, (steps, 16, 16, 3), np.uint8))
            obs.create_dataset("qpos", data=rng.normal(size=(steps, 14)))
            obs.create_dataset("qvel", data=rng.normal(size=(steps, 14)))
            root.create_dataset("action", data=rng.normal(size=(steps, 14)))
    return folder


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def leftovers(out: Path) -> list[str]:
    return [n for n in os.listdir(out.parent) if n.startswith(f".{out.name}.episodekit-")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The source, an uninterrupted import of it and its crash points (numbered as reached)."""
    base = tmp_path_factory.mktemp("resume")
    src = write_source(base / "src")
    log = base / "points.log"
    r = ek("import", str(src), "--out", str(base / "ref"), *SMALL, env={LOG_ENV: str(log)})
    assert r.returncode == 0, r.stderr
    points = [line.split(" ", 1) for line in log.read_text().splitlines()]
    checkpoints = [int(n) for n, name in points if name == CHECKPOINT]
    assert len(checkpoints) >= 3, points  # several data files: resumable points
    return {
        "src": src,
        "ref": base / "ref",
        "checkpoints": checkpoints,
        "json": json.loads(r.stdout),
    }


def kept_at(ref: Path, files_done: int) -> int:
    """Episodes of the reference's first ``files_done`` data files."""
    eps = pq.read_table(ref / "meta/episodes", columns=["data/file_index"]).column(0).to_numpy()
    return int((eps < files_done).sum())


def test_kill_at_a_checkpoint_then_rerun_resumes(reference, tmp_path):
    out = tmp_path / "out"
    at = reference["checkpoints"][1]  # the second data file just closed and journaled
    r = ek(
        "import", str(reference["src"]), "--out", str(out), *SMALL, env={CRASH_ENV: f"KILL:{at}"}
    )
    assert r.returncode == -signal.SIGKILL
    assert not out.exists()  # nothing published
    assert len(leftovers(out)) == 1  # the staging folder, kept for the rerun

    r = ek("import", str(reference["src"]), "--out", str(out), *SMALL)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "written" and doc["episodes"] == 40
    assert doc["resumed"] == kept_at(reference["ref"], 2) > 0  # not written again
    assert files(out) == files(reference["ref"])
    assert leftovers(out) == []


def test_other_inputs_start_fresh(reference, tmp_path):
    out = tmp_path / "out"
    at = reference["checkpoints"][1]
    r = ek(
        "import", str(reference["src"]), "--out", str(out), *SMALL, env={CRASH_ENV: f"KILL:{at}"}
    )
    assert r.returncode == -signal.SIGKILL
    other = [a if a != "50" else "25" for a in SMALL]  # another fps: another inputs key
    r = ek("import", str(reference["src"]), "--out", str(out), *other)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed"] == 0
    assert leftovers(out) == []  # the killed run's folder removed, not reused
    assert json.loads((out / "meta/info.json").read_text())["fps"] == 25


def test_kill_9_the_process_tree_mid_way_then_rerun(reference, tmp_path):
    """Timing-based: --jobs 2 (worker processes), the whole group killed once a journal
    shows a finished data file."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "episodekit.cli", "import", str(reference["src"])]
    cmd += ["--out", str(out), *SMALL, "--jobs", "2"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        if any(tmp_path.glob(".out.episodekit-partial-*/.episodekit-import/journal.json")):
            break
        time.sleep(0.01)
    assert p.poll() is None, "the import finished before a kill"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(0.5)
    alive = [q for q in psutil.process_iter() if _pgid(q.pid) == p.pid and _running(q)]
    assert alive == []  # (zombies are dead: a container's init may not reap them)
    assert not out.exists()

    r = ek("import", str(reference["src"]), "--out", str(out), *SMALL)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed"] > 0
    assert files(out) == files(reference["ref"])


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _running(q: psutil.Process) -> bool:
    try:
        return q.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
