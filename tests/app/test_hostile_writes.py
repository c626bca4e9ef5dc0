"""Hostile tests of the write paths (issue 41, items 1, 6, 7), as a user runs the CLI, on copies
of the LeRobot-written fixtures: a command never deletes or renames a path it did not create
or mark as its own (its staging and backup folders carry a random token and a marker), a full
disk (or any error) leaves nothing under the final name, and paths are paths, not patterns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from episodekit.core.atomic import KILL_HOOK_ENV
from tests.app.hostile import cli, copy_fixture, ok, on_small_disk, one_error, tree, written

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
KILL_AFTER_SWAP_ENV = "EPISODEKIT_TEST_KILL_AFTER_SWAP"  # core/staging.py's test hook


def users_folders(parent: Path, out_name: str) -> dict[Path, dict]:
    """Folders a user may keep next to an output: names that look like an old run's staging or
    backup folders (but hold no marker of ours). Returns each with its tree."""
    made = {}
    for name in (
        f"{out_name}.old-backup",
        f"{out_name}.partial-notes",
        f".{out_name}.old-mine",
        f".{out_name}.tmp-1-mine",
        f".{out_name}.episodekit-partial-{uuid.uuid4().hex}",
        f".{out_name}.episodekit-old-{uuid.uuid4().hex}",
    ):
        p = parent / name
        (p / "meta").mkdir(parents=True)
        (p / "notes.txt").write_text("mine\n")
        (p / "meta/info.json").write_text("{}")
        made[p] = tree(p)
    return made


def assert_intact(folders: dict[Path, dict]) -> None:
    for p, before in folders.items():
        assert p.is_dir(), f"{p.name} was deleted"
        assert tree(p) == before, f"{p.name} was changed"


# -- 1. staging and backup names can never be a user's ---------------------------------------


def test_edit_of_a_root_named_like_a_backup_leaves_it_alone(tmp_path):
    src = copy_fixture("rec40", tmp_path / "robot.old-2024")
    before = tree(src)
    ok(cli("edit", src, "--out", tmp_path / "robot", "--drop-episodes", "0"))
    assert tree(src) == before
    ok(cli("edit", src, "--out", tmp_path / "robot", "--drop-episodes", "0,1"))  # replaces robot
    assert tree(src) == before


@pytest.mark.parametrize("command", ["edit", "merge", "split"])
def test_users_folders_next_to_out_survive(tmp_path, command):
    src = copy_fixture("rec40", tmp_path / "src")
    other = copy_fixture("edited35", tmp_path / "other")
    mine = users_folders(tmp_path, "mydata")
    out = tmp_path / "mydata"
    args = {
        "edit": ["edit", src, "--drop-episodes", "0"],
        "merge": ["merge", src, other],
        "split": ["split", src, "--fractions", "a=0.5,b=0.5"],
    }[command]
    ok(cli(*args, "--out", out))
    ok(cli(*args, "--out", out))  # a rerun (nothing to do)
    assert_intact(mine)
    assert (out / "meta/info.json").exists() or (out / "a/meta/info.json").exists()


def test_out_with_glob_characters_deletes_no_other_folder(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    mine = users_folders(tmp_path, "x")
    ok(cli("edit", src, "--out", tmp_path / "[rx]", "--drop-episodes", "0"))
    ok(cli("edit", src, "--out", tmp_path / "[rx]", "--drop-episodes", "1"))
    assert_intact(mine)
    assert (tmp_path / "[rx]/meta/info.json").exists()


def test_split_part_named_like_a_backup_is_kept(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    d = written(
        cli("split", src, "--out", tmp_path / "sp", "--fractions", "a.old-x=0.5,a=0.5", "--json")
    )
    assert set(d["splits"]) == {"a.old-x", "a"}
    for name in ("a.old-x", "a"):
        assert (tmp_path / "sp" / name / "meta/info.json").exists(), name


def _ours(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".episodekit-" in p.name)


def test_a_killed_write_leaves_marked_staging_that_the_rerun_removes(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    mine = users_folders(tmp_path, "out")
    lookalikes = set(_ours(tmp_path))
    out = tmp_path / "out"
    killed = cli(
        "edit", src, "--out", out, "--drop-episodes", "3", env={KILL_HOOK_ENV: "stats.json"}
    )
    assert killed.returncode == -signal.SIGKILL
    assert not (out / "meta").exists()  # nothing published
    staged = set(_ours(tmp_path)) - lookalikes
    assert len(staged) == 1  # the killed run's staging folder, hidden and marked
    ok(cli("edit", src, "--out", out, "--drop-episodes", "3"))
    assert set(_ours(tmp_path)) == lookalikes  # ours removed, the user's lookalikes kept
    assert_intact(mine)


def test_killed_between_swap_and_clean_up_leaves_a_complete_output(tmp_path):
    """Killed right after the new output took the final name (the replaced one not yet
    deleted): --out is complete, and the next run (even one with nothing to do) removes the
    replaced output, which carries our marker, and nothing of the user's."""
    src = copy_fixture("rec40", tmp_path / "src")
    out = tmp_path / "out"
    mine = users_folders(tmp_path, "out")
    lookalikes = set(_ours(tmp_path))
    ok(cli("edit", src, "--out", out, "--drop-episodes", "0"))
    args = ("edit", src, "--out", out, "--drop-episodes", "0,1", "--json")
    killed = cli(*args, env={KILL_AFTER_SWAP_ENV: str(out)})
    assert killed.returncode == -signal.SIGKILL
    assert json.loads((out / "meta/info.json").read_text())["total_episodes"] == 38
    assert len(set(_ours(tmp_path)) - lookalikes) == 1  # the replaced output, marked
    assert written(cli(*args))["status"] == "unchanged"
    assert set(_ours(tmp_path)) == lookalikes
    assert_intact(mine)


@pytest.mark.parametrize("command", ["prepare", "rowgroups", "split"])
def test_killed_mid_run_publishes_nothing_and_the_rerun_completes(tmp_path, command):
    src = copy_fixture("rec40", tmp_path / "src")
    out = tmp_path / "out"
    argv, hook, done = {
        "prepare": (
            ["prepare", src, "--out", out, "--world-size", "1", "--workers", "1"],
            "speed_percentiles",
            "meta/speed_percentiles.jsonl",
        ),
        "rowgroups": (["prep", "rowgroups", src, "--out", out], "info.json", "meta/info.json"),
        "split": (
            ["split", src, "--out", out, "--fractions", "a=0.5,b=0.5"],
            "stats.json",  # the first part's stats: killed with part a half done
            "b/meta/info.json",
        ),
    }[command]
    before = tree(src)
    killed = cli(*argv, env={KILL_HOOK_ENV: hook})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not out.exists()  # not even a folder holding a lock file (issue 48)
    assert len(_ours(tmp_path)) == 1  # the staging folder, hidden and marked
    ok(cli(*argv))
    assert (out / done).exists() and _ours(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]  # the lock file gone with its holder
    assert tree(src) == before


def test_frame_store_publish_keeps_users_lookalike_folders(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    store = tmp_path / "cache" / "rec40-frames"
    store.parent.mkdir()
    mine = users_folders(store.parent, store.name)
    ok(cli("prep", "frames", src, "--store", store))
    ok(cli("prep", "frames", src, "--store", store, "--force"))  # replaces its own store
    assert_intact(mine)
    assert (store / "manifest.json").exists()
    assert set(_ours(store.parent)) == {
        p.name for p in mine if ".episodekit-" in p.name
    }  # nothing of ours left


# -- 6. a full disk (or any error) leaves nothing under the final name ----------------------


def test_split_on_a_full_disk_publishes_no_part(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    mnt = tmp_path / "mnt"
    r = on_small_disk(mnt, 1300, "split", src, "--out", mnt / "sp", "--fractions", "a=0.5,b=0.5")
    assert r["rc"] == 2, r
    assert str(mnt) in r["stderr"]  # the message names the path
    assert not [p for p in r["left"] if p.startswith("sp/")], r["left"]


@pytest.mark.parametrize("command", ["rowgroups", "prepare", "edit", "convert"])
def test_a_full_disk_leaves_no_partial_dataset(tmp_path, command):
    src = copy_fixture("v21vid8" if command == "convert" else "rec40", tmp_path / "src")
    mnt = tmp_path / "mnt"
    out = mnt / "o"
    argv = {
        "rowgroups": ["prep", "rowgroups", src, "--out", out],
        "prepare": ["prepare", src, "--out", out, "--world-size", "1", "--workers", "1"],
        "edit": ["edit", src, "--out", out, "--drop-episodes", "0"],
        "convert": ["convert", src, "--out", out],
    }[command]
    r = on_small_disk(mnt, 700, *argv)
    assert r["rc"] == 2, r
    line = [ln for ln in r["stderr"].splitlines() if ln.startswith("Error")]
    assert len(line) == 1 and str(mnt) in line[0], r["stderr"]  # one line naming the path
    assert not [p for p in r["left"] if p == "o" or p.startswith("o/")], r["left"]
    assert r["left"] == [], r["left"]  # no staging left either


# -- 7. paths are paths, symlinks are resolved, numbers are bounded -------------------------


def test_a_root_under_a_folder_with_glob_characters_is_read(tmp_path):
    src = copy_fixture("rec40", tmp_path / "we[ird] *?" / "rec40")
    ok(cli("validate", src, "--checks", "info,episodes,data"))
    d = written(cli("edit", src, "--out", tmp_path / "o[1]", "--drop-episodes", "0", "--json"))
    assert d["episodes"] == 39
    ok(cli("validate", tmp_path / "o[1]", "--checks", "info,episodes,data"))


def test_a_dangling_symlink_out_creates_nothing(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    target = tmp_path / "nowhere" / "deeper" / "out"
    link = tmp_path / "link"
    link.symlink_to(target)
    for argv in (
        ["edit", src, "--drop-episodes", "0"],
        ["split", src, "--fractions", "a=0.5,b=0.5"],
        ["prep", "rowgroups", src],
    ):
        line = one_error(cli(*argv, "--out", link))
        assert str(link) in line
        assert not (tmp_path / "nowhere").exists()
        assert link.is_symlink() and os.readlink(link) == str(target)


def test_a_symlink_to_a_folder_out_writes_into_its_target(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    target = tmp_path / "real"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    ok(cli("edit", src, "--out", link, "--drop-episodes", "0"))
    assert link.is_symlink() and (target / "meta/info.json").exists()


def test_a_symlinked_store_is_built_in_its_target(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    for _ in range(2):  # built, then rebuilt (published over the previous store)
        ok(cli("prep", "frames", src, "--store", link, "--force"))
    assert link.is_symlink() and (tmp_path / "real/manifest.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real", "src"]


def test_split_out_inside_the_source_changes_nothing(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    before = tree(src)
    one_error(cli("split", src, "--out", src / "sp", "--fractions", "a=0.5,b=0.5"))
    assert tree(src) == before


@pytest.mark.parametrize(
    "option",
    [
        ["--drop-episodes", "1000000000000000000000"],
        ["--keep-episodes", "0-1000000000000000000000"],
        ["--drop-episodes", "0", "--target-mb", "inf"],
        ["--drop-episodes", "0", "--target-mb", "1e300"],
    ],
)
def test_huge_numbers_are_exit_2(tmp_path, option):
    src = copy_fixture("rec40", tmp_path / "src")
    one_error(cli("edit", src, "--out", tmp_path / "o", *option))
    assert not (tmp_path / "o").exists()


def test_huge_target_for_rowgroups_and_convert_is_exit_2(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    one_error(cli("prep", "rowgroups", src, "--target-mb", "inf"))
    v21 = copy_fixture("v21vid8", tmp_path / "v21")
    one_error(cli("convert", v21, "--out", tmp_path / "c", "--data-mb", "inf"))
    assert not (tmp_path / "c").exists()


def test_no_write_command_renames_the_source_out_of_its_way(tmp_path):
    """The output's staging and backup live next to --out, never at a source's name."""
    src = copy_fixture("rec40", tmp_path / "out.old-1")
    before = tree(src)
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-m", "episodekit.cli", "merge", src, src, "--out", tmp_path / "out"],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
    assert tree(src) == before
    assert json.loads((tmp_path / "out/meta/info.json").read_text())["total_episodes"] == 80


def _feature_file(src: Path, tmp: Path) -> Path:
    """A value for every frame of ``src`` (what ``edit --add-feature`` reads)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = ["episode_index", "frame_index"]
    t = pa.concat_tables(
        pq.read_table(f, columns=cols) for f in sorted(src.glob("data/*/*.parquet"))
    )
    path = tmp / "reward.parquet"
    pq.write_table(t.append_column("value", pa.array([1.0] * t.num_rows)), path)
    return path


@pytest.mark.parametrize(
    "case, fixture, hook",
    [
        ("drop-frames", "rec40", "stats.json"),
        ("drop-frames", "rec40+stats", "episodekit_sketches"),  # a source with a sidecar
        ("drop-frames-video", "vid24", "stats.json"),  # after the smart cut wrote its mp4s
        ("add-feature", "rec40", "info.json"),
        ("repair", "crash_rec7", "stats.json"),
    ],
)
def test_newer_write_paths_killed_publish_nothing(tmp_path, case, fixture, hook):
    """kill -9 just before one of the newer write paths' files is published (frame cuts,
    smart-cut video, an added feature, repair's stats): --out stays empty, the
    source is unchanged, only our marked staging is left, and the rerun completes and removes
    it."""
    src = copy_fixture(fixture.removesuffix("+stats"), tmp_path / "src")
    if fixture.endswith("+stats"):
        ok(cli("metadata", "stats", src))
    out = tmp_path / "out"
    argv = {
        "drop-frames": ["edit", src, "--out", out, "--drop-frames", "3:5-10,7:0-4"],
        "drop-frames-video": ["edit", src, "--out", out, "--drop-frames", "1:1-2"],
        "add-feature": ["edit", src, "--out", out, "--add-feature", "reward", "--from"],
        "repair": ["repair", src, "--out", out],
    }[case]
    if case == "add-feature":
        argv.append(_feature_file(src, tmp_path))
    before = tree(src)
    mine = users_folders(tmp_path, "out")
    lookalikes = set(_ours(tmp_path))
    killed = cli(*argv, env={KILL_HOOK_ENV: hook})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not out.exists()  # not even a folder holding a lock file (issue 48)
    assert len(set(_ours(tmp_path)) - lookalikes) == 1  # the staging folder, hidden and marked
    assert tree(src) == before
    ok(cli(*argv))
    assert (out / "meta/info.json").exists() and set(_ours(tmp_path)) == lookalikes
    assert tree(src) == before
    assert_intact(mine)
