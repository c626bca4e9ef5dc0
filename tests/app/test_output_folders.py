"""A command that fills, replaces or deletes a folder (``sample ROOT``, ``prep rowgroups --out``,
``prepare --out``, ``prep frames --store``) writes only into a missing or empty folder, or one
episodekit wrote itself (its marker), unless ``sample --force``; never ``.``, a parent of the
current folder, ``/`` or ``$HOME``. A refusal is exit 2 with one line, and the user's files stay
exactly as they were. Run as a user runs them: subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from episodekit.core.outdir import MARKER, UnsafeOutputError, check_output_dir

EPISODEKIT = [sys.executable, "-m", "episodekit.cli"]


def run(*args, cwd: Path | None = None, env: dict | None = None):
    return subprocess.run(
        [*EPISODEKIT, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env
    )


def one_error(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    return lines[0]


def precious(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / "important.txt"
    f.write_text("precious")
    return f


def test_sample_refuses_a_folder_with_a_foreign_file(tmp_path):
    f = precious(tmp_path / "x")
    proc = run("sample", tmp_path / "x", "-n", "5")
    assert proc.returncode == 2
    line = one_error(proc)
    assert "important.txt" in line and "--force" in line
    assert f.read_text() == "precious" and sorted(os.listdir(tmp_path / "x")) == ["important.txt"]


@pytest.mark.parametrize("where", [".", "..", "/"])
def test_sample_never_writes_into_the_current_folder_or_above(tmp_path, where):
    cwd = tmp_path / "z"
    f = precious(cwd)
    proc = run("sample", where, "-n", "3", "--force", cwd=cwd)  # not even with --force
    assert proc.returncode == 2
    assert "refusing to write here" in one_error(proc)
    assert f.read_text() == "precious"


def test_sample_never_replaces_home(tmp_path):
    home = tmp_path / "home"
    f = precious(home)
    proc = run("sample", "~", "-n", "3", "--force", env={**os.environ, "HOME": str(home)})
    assert proc.returncode == 2 and "home folder" in one_error(proc)
    assert f.read_text() == "precious"


def test_sample_replaces_its_own_output_and_force_replaces_any(tmp_path):
    out = tmp_path / "s"
    assert run("sample", out, "-n", "3").returncode == 0
    assert (out / MARKER).is_file()
    proc = run("sample", out, "-n", "4")  # its own output: replaced
    assert proc.returncode == 0, proc.stderr
    assert "4 episodes" in proc.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run("sample", empty, "-n", "2").returncode == 0  # an empty folder is fine
    f = precious(tmp_path / "x")
    proc = run("sample", tmp_path / "x", "-n", "2", "--force")
    assert proc.returncode == 0, proc.stderr
    assert not f.exists() and (tmp_path / "x/meta/info.json").is_file()


def test_out_copy_refuses_a_foreign_folder_then_reruns_into_its_own(make_sample, tmp_path):
    root = make_sample(episodes=6, tasks=2, seed=2)
    out = tmp_path / "out"
    f = precious(out)
    plans = ["--world-size", "1", "--workers", "1"]
    for cmd in (["prep", "rowgroups", root, "--out", out], ["prepare", root, "--out", out, *plans]):
        proc = run(*cmd)
        assert proc.returncode == 2, proc.stderr
        assert "not written by episodekit" in one_error(proc)
        assert f.read_text() == "precious"
        assert not (out / "meta").exists() and not (out / "data").exists()
        assert sorted(x.name for x in out.iterdir()) == ["important.txt"], cmd  # no lock left
    out2 = tmp_path / "out2"
    for _ in range(2):  # a rerun into the copy it made is fine
        proc = run("prep", "rowgroups", root, "--out", out2)
        assert proc.returncode == 0, proc.stderr
    assert (out2 / MARKER).is_file() and (out2 / "meta/info.json").is_file()


def test_frame_store_never_replaces_a_foreign_folder(make_sample, tmp_path):
    root = make_sample(episodes=6, tasks=2, seed=2)
    store = tmp_path / "store"
    f = precious(store)
    proc = run("prep", "frames", root, "--store", store)
    assert proc.returncode == 2 and "not written by episodekit" in one_error(proc)
    assert sorted(os.listdir(store)) == ["important.txt"] and f.read_text() == "precious"
    store2 = tmp_path / "store2"
    assert run("prep", "frames", root, "--store", store2).returncode == 0
    proc = run("prep", "frames", root, "--store", store2, "--force")  # its own store: rebuilt
    assert proc.returncode == 0, proc.stderr


def test_check_output_dir_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check_output_dir(tmp_path / "new") == tmp_path / "new"
    (tmp_path / "lockonly").mkdir()
    (tmp_path / "lockonly/.episodekit.lock").write_text("")
    check_output_dir(tmp_path / "lockonly")  # only episodekit's lock: still empty
    precious(tmp_path / "mine")
    (tmp_path / "mine" / MARKER).write_text("")
    check_output_dir(tmp_path / "mine")
    precious(tmp_path / "store")
    (tmp_path / "store/manifest.json").write_text("{}")
    check_output_dir(tmp_path / "store", own=("manifest.json",))
    with pytest.raises(UnsafeOutputError, match="store: not empty"):
        check_output_dir(tmp_path / "store")
    with pytest.raises(UnsafeOutputError, match="is a file"):
        check_output_dir(precious(tmp_path / "f"))
    for protected in (tmp_path, tmp_path.parent, Path("/")):
        with pytest.raises(UnsafeOutputError, match="refusing"):
            check_output_dir(protected, force=True)


# -- one rule for every command that writes a folder (core/outdir.check_output_dir) ------------


def _mixture(src: Path) -> str:
    return json.dumps({"sources": [{"root": str(src), "weight": 1}]})


PLANS = ["--world-size", "1", "--workers", "1"]
# command -> its arguments for (source root, second source root, output folder)
WRITERS = {
    "prepare": lambda s, s2, o: ["prepare", s, "--out", o, *PLANS],
    "prep rowgroups": lambda s, s2, o: ["prep", "rowgroups", s, "--out", o],
    "prep frames": lambda s, s2, o: ["prep", "frames", s, "--store", o],
    "edit": lambda s, s2, o: ["edit", s, "--out", o, "--drop-episodes", "0"],
    "split": lambda s, s2, o: ["split", s, "--out", o, "--fractions", "a=0.5,b=0.5"],
    "merge": lambda s, s2, o: ["merge", s, s2, "--out", o],
    "convert": lambda s, s2, o: ["convert", s, "--out", o],
    "metadata plan --mixture": lambda s, s2, o: [
        "metadata", "plan", "--mixture", _mixture(s), "--out", o, *PLANS
    ],
    "metadata stats --mixture": lambda s, s2, o: [
        "metadata", "stats", "--mixture", _mixture(s), "--out", o
    ],
    "prepare --mixture": lambda s, s2, o: ["prepare", "--mixture", _mixture(s), "--out", o, *PLANS],
    "validate --plots": lambda s, s2, o: [
        "validate", s, "--report", Path(s2).parent / "report.md", "--plots", o
    ],
}  # fmt: skip


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: (size, mtime) by relative path."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_every_output_folder_follows_the_one_rule(command, make_sample, tmp_path, monkeypatch):
    """Each command that writes a folder refuses (exit 2, one line, nothing written): a folder
    holding a user's file; the source dataset itself; a folder inside it; a folder holding it
    (here an episodekit-marked one, so only the source rule can refuse it)."""
    monkeypatch.setenv("EPISODEKIT_CACHE", str(tmp_path / "cache"))
    version = "v2.1" if command == "convert" else "v3.0"
    spec = {"episodes": 6, "tasks": 2, "seed": 2, "version": version}
    parent = tmp_path / "p"
    parent.mkdir()
    (parent / MARKER).write_text("")
    src = make_sample(**spec).rename(parent / "src")
    src2 = make_sample(**{**spec, "seed": 3})
    args = WRITERS[command]
    user = tmp_path / "user"
    f = precious(user)
    proc = run(*args(src, src2, user))
    assert proc.returncode == 2, proc.stderr
    assert "not written by episodekit (it holds 'important.txt')" in one_error(proc)
    assert sorted(os.listdir(user)) == ["important.txt"] and f.read_text() == "precious"
    before = snapshot(parent)
    for out, why in ((src, None), (src / "copy", "is inside"), (parent, "holds")):
        proc = run(*args(src, src2, out))
        assert proc.returncode == 2, (out, proc.stdout, proc.stderr)
        line = one_error(proc)
        if why is not None:
            assert f"refusing to write here: it {why} the source dataset" in line, line
        assert snapshot(parent) == before, out
        assert not (src / "copy").exists()
    proc = run(*args(src2, src, tmp_path / "new"))  # the same command, a new folder: fine
    assert proc.returncode == 0, proc.stderr
    mark = "manifest.json" if command == "prep frames" else MARKER  # a store's own mark
    if command != "validate --plots":  # plots (and their folder) only where findings have some
        assert (tmp_path / "new" / mark).is_file()


def test_mixture_stats_never_replace_a_users_stats_json(make_sample, tmp_path):
    """`metadata stats --mixture M --out DIR` replaced the user's own DIR/stats.json (exit 0);
    into the folder `metadata plan --mixture` wrote, it goes (and reruns)."""
    src = make_sample(episodes=6, tasks=2, seed=2)
    mine = tmp_path / "mine"
    f = mine / "stats.json"
    mine.mkdir()
    f.write_text('{"mine": 1}')
    stats = ["metadata", "stats", "--mixture", _mixture(src), "--out"]
    proc = run(*stats, mine)
    assert proc.returncode == 2 and "it holds 'stats.json'" in one_error(proc)
    assert f.read_text() == '{"mine": 1}' and sorted(os.listdir(mine)) == ["stats.json"]
    plans = tmp_path / "plans"
    proc = run("metadata", "plan", "--mixture", _mixture(src), "--out", plans, *PLANS)
    assert proc.returncode == 0, proc.stderr
    for _ in range(2):
        proc = run(*stats, plans)
        assert proc.returncode == 0, proc.stderr
    assert {"stats.json", "mixture.json", "ws1_nw1.json", MARKER} <= set(os.listdir(plans))
