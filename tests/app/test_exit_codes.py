"""One meaning per exit code (docs/exit-codes.md), checked over every command x situation as a
user meets them: each cell runs the CLI as a subprocess. 0 success; 1 the data is at fault; 2 the
command cannot run as asked (usage, a missing path, the environment); 130 interrupted. Every
failure is one ``Error:`` line naming the path at most once, never a traceback or a class name.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from episodekit.sample import write_sample

EPISODEKIT = [sys.executable, "-m", "episodekit.cli"]
ROOT_NAME = "rootq7"  # a unique name: how often the error line names the root
CLASS_NAMES = ("EnvironmentProblem", "DatasetError", "MixtureError", "Traceback", "Exception")
DROP = "-dac_override,-dac_read_search,-fowner"
SETPRIV = ["setpriv", "--bounding-set", DROP, "--inh-caps", DROP]

# Commands that read ROOT (never write it) and commands that write into it: (command words,
# options that make them run on a 6-episode sample). {store}: a frame-store folder, {out}: a
# mixture output folder.
READERS = {"info": (["info"], []), "validate": (["validate"], [])}
WRITERS = {
    "prepare": (["prepare"], ["--world-size", "1", "--workers", "1", "--jobs", "1"]),
    "prep rowgroups": (["prep", "rowgroups"], ["--jobs", "1"]),
    "prep frames": (["prep", "frames"], ["--store", "{store}"]),
    "metadata speed": (["metadata", "speed"], []),
    "metadata costs": (["metadata", "costs"], []),
    "metadata plan": (["metadata", "plan"], ["--world-size", "1"]),
    "metadata stats": (["metadata", "stats"], []),
}
ALL = {**READERS, **WRITERS, "prep videos": (["prep", "videos"], []), "sample": (["sample"], [])}
MIXTURE = {
    "info": (["info"], []),
    "metadata plan": (["metadata", "plan"], ["--world-size", "1", "--out", "{out}"]),
    "metadata stats": (["metadata", "stats"], ["--out", "{out}"]),
    "prepare": (["prepare"], ["--world-size", "1", "--workers", "1", "--out", "{out}"]),
}


def argv(cmd: tuple[list[str], list[str]], root: str | None, tmp: Path, store=None) -> list[str]:
    """The command line: words, ROOT, options (placeholders filled in)."""
    words, opts = cmd
    fill = {"{store}": str(store or tmp / "store"), "{out}": str(tmp / "mixout")}
    opts = [fill.get(o, o) for o in opts]
    return [*words, *([root] if root is not None else []), *opts]


def run(args: list[str], prefix: list[str] = (), cwd: Path | None = None, timeout=300):
    return subprocess.run(
        [*prefix, *EPISODEKIT, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def error_line(proc) -> str:
    """The one ``Error:`` line of a failed command; no traceback, no class names."""
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error")]
    assert len(errors) == 1, proc.stderr
    for name in CLASS_NAMES:
        assert name not in proc.stderr, proc.stderr
    return errors[0]


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    return write_sample(tmp_path_factory.mktemp("exit") / "src", episodes=6, tasks=2, seed=3)


@pytest.fixture
def root(sample, tmp_path) -> Path:
    dst = tmp_path / ROOT_NAME
    shutil.copytree(sample, dst)
    return dst


NO_SAMPLE = sorted(set(ALL) - {"sample"})


@pytest.mark.parametrize("name", NO_SAMPLE)
def test_missing_root_is_2(name, tmp_path):
    proc = run(argv(ALL[name], str(tmp_path / ROOT_NAME), tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "no such folder" in error_line(proc)


@pytest.mark.parametrize("name", sorted(ALL))
def test_root_is_a_file_is_2(name, tmp_path):
    f = tmp_path / ROOT_NAME
    f.write_text("not a dataset")
    proc = run(argv(ALL[name], str(f), tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert error_line(proc).count(ROOT_NAME) == 1
    assert f.read_text() == "not a dataset"


@pytest.mark.parametrize("name", NO_SAMPLE)
def test_bad_info_json_is_1(name, root, tmp_path):
    (root / "meta/info.json").write_text('{"codebase_version": "v3.0", ')
    proc = run(argv(ALL[name], str(root), tmp_path))
    assert proc.returncode == 1, proc.stderr
    line = error_line(proc)
    assert "info.json: not valid JSON" in line and line.count(ROOT_NAME) == 1


@pytest.mark.parametrize("name", sorted(MIXTURE))
def test_missing_mixture_source_is_2(name, root, tmp_path):
    m = tmp_path / "m.json"
    missing = tmp_path / "gone"
    m.write_text(
        json.dumps(
            {"sources": [{"root": str(root), "weight": 1}, {"root": str(missing), "weight": 1}]}
        )
    )
    proc = run(argv(MIXTURE[name], None, tmp_path) + ["--mixture", str(m)])
    assert proc.returncode == 2, proc.stderr
    assert f"{missing}: no such folder" in error_line(proc)
    assert not (tmp_path / "mixout").exists()


def _can_drop_capabilities(tmp_path: Path) -> bool:
    """setpriv can drop the capabilities that let root write anywhere (checked by trying)."""
    if shutil.which("setpriv") is None:
        return False
    ro = tmp_path / "probe"
    ro.mkdir()
    ro.chmod(0o555)
    proc = subprocess.run([*SETPRIV, "touch", str(ro / "x")], capture_output=True)
    ro.chmod(0o755)
    return proc.returncode != 0 and not (ro / "x").exists()


@pytest.fixture
def read_only(root, tmp_path) -> tuple[Path, list[str]]:
    """``root`` made read-only (every file and folder), and the command prefix that runs a
    process without the capabilities to ignore that (as a root user has them)."""
    if os.geteuid() == 0 and not _can_drop_capabilities(tmp_path):
        pytest.skip("running as root and setpriv cannot drop dac_override here")
    prefix = SETPRIV if os.geteuid() == 0 else []
    for p in [root, *root.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    yield root, prefix
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_read_only_root_is_2_for_every_writing_command(name, read_only, tmp_path):
    root, prefix = read_only
    before = tree(root)
    proc = run(argv(WRITERS[name], str(root), tmp_path, store=root / "store"), prefix)
    assert proc.returncode == 2, proc.stderr
    assert error_line(proc).count(ROOT_NAME) == 1
    assert tree(root) == before


@pytest.mark.parametrize("name", sorted(READERS))
def test_read_only_root_is_0_for_readers(name, read_only, tmp_path):
    root, prefix = read_only
    args = argv(READERS[name], str(root), tmp_path)
    proc = run(args + (["--checks", "all,-layout"] if name == "validate" else []), prefix)
    assert proc.returncode == 0, proc.stderr


def test_sample_into_a_read_only_folder_is_2(read_only, tmp_path):
    root, prefix = read_only
    proc = run(["sample", str(root / "new"), "-n", "3"], prefix)
    assert proc.returncode == 2, proc.stderr
    assert error_line(proc).count(ROOT_NAME) == 1


# -- disk full: a small tmpfs in a private mount namespace --------------------------------------


def _full_disk_script(src: Path, mnt: Path, args: list[str]) -> list[str]:
    """A shell that mounts a 4 MiB tmpfs on ``mnt`` (private mount namespace), copies the
    dataset there, fills what is left, then runs the command (``{root}`` in ``args``)."""
    cmd = " ".join(f"'{a}'" for a in [*EPISODEKIT, *args]).replace("{root}", f"{mnt}/{ROOT_NAME}")
    script = (
        f"mount -t tmpfs -o size=4m tmpfs '{mnt}' && cp -r '{src}' '{mnt}/{ROOT_NAME}' && "
        f"(dd if=/dev/zero of='{mnt}/fill' bs=4k 2>/dev/null; true) && exec {cmd}"
    )
    return ["unshare", "-m", "sh", "-c", script]


@pytest.fixture(scope="module")
def tmpfs_ok(tmp_path_factory) -> None:
    mnt = tmp_path_factory.mktemp("mnt")
    probe = ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs '{mnt}'"]
    if shutil.which("unshare") is None or subprocess.run(probe, capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (unshare -m / mount not permitted)")


DISK_FULL = {
    **WRITERS,
    "prep frames": (["prep", "frames"], ["--store", "{root}/../store"]),
    "sample": (["sample"], ["-n", "40"]),
}


@pytest.mark.parametrize("name", sorted(DISK_FULL))
def test_disk_full_is_2(name, tmpfs_ok, sample, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    root = "{root}/../new" if name == "sample" else "{root}"
    args = argv(DISK_FULL[name], root, tmp_path)
    proc = subprocess.run(
        _full_disk_script(sample, mnt, args), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr
    assert "No space left on device" in error_line(proc)


# -- Ctrl-C: SIGINT to a running command --------------------------------------------------------

# Runs the CLI with a pause at the first read of meta/info.json (every command reads it), so the
# signal arrives while the command is at work, not before it started.
PAUSED_CLI = """
import builtins, sys, time
real_open = builtins.open
def paused_open(path, *args, **kwargs):
    if str(path).endswith("info.json"):
        builtins.open = real_open
        print("READY", file=sys.stderr, flush=True)
        time.sleep(60)
    return real_open(path, *args, **kwargs)
builtins.open = paused_open
from episodekit.cli import main
main()
"""


@pytest.mark.parametrize("name", sorted(ALL))
def test_ctrl_c_is_130(name, root, tmp_path):
    where = tmp_path / "new" if name == "sample" else root
    args = argv(ALL[name], str(where), tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSED_CLI, *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        first = proc.stderr.readline()
        deadline = time.monotonic() + 60
        while "READY" not in first and first and time.monotonic() < deadline:
            first = proc.stderr.readline()
        assert "READY" in first, first
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) == 130, rest
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in rest and "Error: interrupted" in rest
