"""Helpers of the hostile write tests (tests/app/test_hostile_*.py): the CLI as a subprocess,
copies of the LeRobot-written fixtures, a hash of a folder tree, and a small tmpfs in a private
mount namespace (``unshare -rm``) for disk-full runs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LEROBOT = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
LOCK = ".episodekit.lock"


def cli(*args: str | os.PathLike, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """``episodekit ARGS`` as a user runs it (its own process), with its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "episodekit.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr
    return proc


def one_error(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    """The one ``Error: ...`` line of a run that failed with ``code`` (no traceback)."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error")]
    assert len(lines) == 1, proc.stderr
    assert "unexpected" not in lines[0], lines[0]
    return lines[0]


def copy_fixture(name: str, dst: Path) -> Path:
    shutil.copytree(LEROBOT / name, dst)
    return dst


def tree(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` with a content hash (symlinks not followed)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def written(proc: subprocess.CompletedProcess) -> dict:
    """The ``--json`` result of a dataset writer."""
    return json.loads(ok(proc).stdout)


def can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null"],
        capture_output=True,
    )
    return probe.returncode == 0


def on_small_disk(mnt: Path, size_kb: int, *argv: str | os.PathLike) -> dict:
    """Run ``episodekit ARGV`` with a ``size_kb`` tmpfs mounted at ``mnt`` (a private mount
    namespace: ``unshare -rm``), and report its exit code, stderr and every path left under
    ``mnt`` (the mount vanishes with the namespace, so the listing is taken inside it)."""
    if not can_mount_tmpfs():
        pytest.skip("no private tmpfs here (unshare -rm and mount are not permitted)")
    mnt.mkdir(parents=True, exist_ok=True)
    lister = (
        "import os, sys, json; m = sys.argv[1]; "
        "print(json.dumps(sorted(os.path.relpath(os.path.join(d, n), m) "
        "for d, ds, fs in os.walk(m) for n in ds + fs)))"
    )
    cmd = " ".join(map(_quote, [sys.executable, "-m", "episodekit.cli", *argv]))
    script = (
        f"mount -t tmpfs -o size={size_kb}k tmpfs {_quote(mnt)} || exit 99; "
        f"{cmd} 2>{_quote(mnt.parent / 'stderr.txt')}; echo $? > {_quote(mnt.parent / 'rc')}; "
        f"{_quote(sys.executable)} -c {_quote(lister)} {_quote(mnt)} > {_quote(mnt.parent / 'ls')}"
    )
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True)
    assert proc.returncode != 99, proc.stderr
    return {
        "rc": int((mnt.parent / "rc").read_text()),
        "stderr": (mnt.parent / "stderr.txt").read_text(),
        "left": json.loads((mnt.parent / "ls").read_text()),
    }


def _quote(s: str | os.PathLike) -> str:
    import shlex

    return shlex.quote(str(s))
