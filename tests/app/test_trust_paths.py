"""Path safety: a root's metadata (info.json templates, indices, video keys) and its symlinks can
never make a command write (or read artifacts) outside the root or ``--out``. Run as a user runs
the CLI (subprocess): refused with exit 2 and the offending value, ``validate`` reports
``info.paths``, and nothing outside changes."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from episodekit.core.dataset import open_dataset
from episodekit.core.lock import LOCK_NAME
from episodekit.core.outdir import MARKER
from episodekit.core.paths import UnsafePathError, format_template, inside_root

SPEC = dict(episodes=12, tasks=2, seed=3)
CLI = "import sys; from episodekit.cli import main; sys.argv[0] = 'episodekit'; main()"


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def tree_state(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (not following symlinks) with a content hash."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.name == LOCK_NAME:
            continue  # the writer lock a refused command took (empty); writes nothing else
        if p.is_symlink():
            out[rel] = "link:" + str(p.readlink())
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def set_info(root: Path, **changes) -> None:
    path = root / "meta/info.json"
    info = json.loads(path.read_text())
    info.update(changes)
    path.write_text(json.dumps(info))


@pytest.fixture
def world(make_sample, tmp_path) -> tuple[Path, Path]:
    """(root, escape): a sample inside tmp_path/box/root, and a sibling folder ``escape`` holding
    a copy of the data files, which a traversal template would point at."""
    box = tmp_path / "box"
    box.mkdir()
    root = box / "root"
    shutil.copytree(make_sample(**SPEC), root)
    escape = box / "escape"
    shutil.copytree(root / "data", escape / "data")
    return root, escape


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    "data_path",
    [
        "../escape/data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "ABS/data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "data/chunk-{chunk_index.__class__.__mro__}/file-{file_index:03d}.parquet",
        "data/chunk-{chunk_index:0>10000000}/file-{file_index:03d}.parquet",
        "data/{chunk_index!r}/file-{file_index:03d}.parquet",
    ],
)
def test_unsafe_data_path_is_refused_everywhere(world, data_path):
    root, escape = world
    data_path = data_path.replace("ABS", str(escape))
    set_info(root, data_path=data_path)
    box = root.parent
    before = tree_state(box)
    shown = data_path[:40]
    commands = [
        ["prepare", root, "--world-size", "2", "--workers", "1"],
        ["prep", "rowgroups", root, "--quiet", "--out", box / "out"],
    ]
    if data_path.startswith("../"):  # every writing command, once
        commands += [
            ["prep", "rowgroups", root, "--quiet"],
            ["metadata", "costs", root, "--model", "bytes"],
            ["metadata", "speed", root],
            ["metadata", "plan", root, "--world-size", "2"],
        ]
    for cmd in commands:
        proc = run_cli(*cmd)
        assert proc.returncode == 2, (cmd, proc.stdout, proc.stderr)
        line = one_line_error(proc)
        assert "info.json" in line and shown[:20] in line, line
    proc = run_cli("validate", root, "--json")
    assert proc.returncode == 1, proc.stderr
    checks = {f["check"] for f in json.loads(proc.stdout)["findings"]}
    assert "info.paths" in checks
    after = tree_state(box)
    assert after == before  # nothing written anywhere, inside or outside


def test_video_path_traversal(make_sample, tmp_path):
    box = tmp_path / "box"
    box.mkdir()
    root = box / "root"
    shutil.copytree(make_sample(episodes=8, tasks=2, videos=1, seed=4), root)
    shutil.copytree(root / "videos", box / "videos")
    set_info(
        root, video_path="../videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    )
    proc = run_cli("validate", root, "--json")
    assert proc.returncode == 1
    findings = json.loads(proc.stdout)["findings"]
    assert any(f["check"] == "info.paths" and "leaves the root" in f["message"] for f in findings)
    proc = run_cli("metadata", "costs", root, "--model", "bytes")
    assert proc.returncode == 2 and "leaves the root" in one_line_error(proc)
    assert not (root / "meta/episode_costs.parquet").exists()
    from episodekit.loaders import FrameDataset

    with pytest.raises(UnsafePathError, match="leaves the root"):
        FrameDataset(str(root), speed=False)


def test_video_key_cannot_climb(make_sample):
    with pytest.raises(UnsafePathError):
        format_template("videos/{video_key}/f.mp4", video_key="..")
    with pytest.raises(UnsafePathError):
        format_template("videos/{video_key}/f.mp4", video_key="a/../../b")


def test_symlinked_data_folder_is_not_followed_out(world):
    root, escape = world
    chunk = root / "data/chunk-000"
    shutil.rmtree(chunk)
    chunk.symlink_to(escape / "data/chunk-000", target_is_directory=True)
    before = tree_state(escape)
    with pytest.raises(UnsafePathError, match="resolves outside the root"):
        inside_root(root, "data/chunk-000/file-000.parquet")
    for cmd in (
        ["prepare", root, "--world-size", "2", "--workers", "1", "--target-mb", "0.01"],
        ["prep", "rowgroups", root, "--quiet", "--target-mb", "0.01"],
    ):
        proc = run_cli(*cmd)
        assert proc.returncode == 2, (cmd, proc.stderr)
        assert "resolves outside the root" in one_line_error(proc)
    proc = run_cli("validate", root, "--json")
    assert proc.returncode == 1
    assert any(f["check"] == "info.paths" for f in json.loads(proc.stdout)["findings"])
    assert tree_state(escape) == before


def test_out_is_never_left_and_never_the_source(world, tmp_path):
    root, escape = world
    before_root = tree_state(root)
    # --out naming the root itself would rewrite the source in place: refused.
    for cmd in (["prepare", root, "--out", root], ["prep", "rowgroups", root, "--out", root]):
        proc = run_cli(*cmd, "--world-size", "2") if cmd[0] == "prepare" else run_cli(*cmd)
        assert proc.returncode == 2, proc.stderr
        assert "refusing to write here: it is the source dataset" in one_line_error(proc)
    # An --out whose data/ is a symlink to elsewhere (here: the source's own data) cannot
    # redirect a write: the copy is built in a fresh staging folder (the link is not carried
    # over) and swapped in whole; the link itself is deleted with the replaced folder, never
    # followed.
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text("")  # an earlier episodekit output (else refused as foreign)
    (out / "data").symlink_to(root / "data", target_is_directory=True)
    proc = run_cli("prep", "rowgroups", root, "--quiet", "--out", out, "--target-mb", "0.01")
    assert proc.returncode == 0, proc.stderr
    assert tree_state(root) == before_root
    assert not (out / "data").is_symlink() and open_dataset(str(out)).num_episodes
    # A plain --out works and leaves the source untouched.
    out2 = tmp_path / "out2"
    proc = run_cli("prep", "rowgroups", root, "--quiet", "--out", out2, "--target-mb", "0.01")
    assert proc.returncode == 0, proc.stderr
    assert tree_state(root) == before_root
    assert open_dataset(str(out2)).num_episodes == SPEC["episodes"]


def test_symlinked_meta_is_not_written_through(world):
    root, escape = world
    (escape / "meta").mkdir()
    (root / "meta/shard_plans").parent.mkdir(exist_ok=True)
    (root / "meta/shard_plans").symlink_to(escape / "meta", target_is_directory=True)
    proc = run_cli("metadata", "plan", root, "--world-size", "2")
    assert proc.returncode == 2, proc.stderr
    assert "resolves outside the root" in one_line_error(proc)
    assert list((escape / "meta").iterdir()) == []
