"""Errors that used to escape as tracebacks: disk full during an artifact write, read-only roots
with missing artifacts or stamp, a clean-up that fails too, a failed rowgroups step. Each is one
line naming the file and the operation, with exit 2 for the environment (1 for data)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import episodekit.core.atomic as atomic
import episodekit.prep.rewrite as rw
from episodekit.cli import main
from episodekit.core.atomic import is_temp_name
from episodekit.core.errors import DatasetError, EnvironmentProblem, os_problem

PREP = ["--world-size", "2", "--workers", "2"]


def run(*args) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback: the test fails with it
    return result.exit_code, result.output


def error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("Error")]


def temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if is_temp_name(p.name)]


def test_os_problem_classifies():
    env = os_problem(OSError(errno.ENOSPC, "No space left on device"), "/x/f", "write")
    assert (
        isinstance(env, EnvironmentProblem)
        and str(env) == "/x/f: cannot write: No space left on device"
    )
    data = os_problem(OSError("Couldn't deserialize thrift"), "/x/f", "read")
    assert isinstance(data, DatasetError) and not isinstance(data, EnvironmentProblem)


@pytest.mark.parametrize(
    "cmd,name",
    [
        (["metadata", "costs"], "episode_costs.parquet"),
        (["metadata", "speed"], "speed_percentiles.jsonl"),
        (["metadata", "plan", "--world-size", "2"], "episode_costs.parquet"),  # costs first
    ],
)
def test_disk_full_with_failing_cleanup_is_one_line_exit_2(small_root, monkeypatch, cmd, name):
    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    def erofs(path):  # the clean-up fails too: must not mask the cause
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(atomic.os, "replace", full)
    monkeypatch.setattr(atomic.os, "unlink", erofs)
    code, out = run(*cmd, small_root)
    monkeypatch.undo()
    assert code == 2, out
    (line,) = error_lines(out)
    assert name in line and "cannot replace: No space left on device" in line
    for p in temporaries(small_root):
        p.unlink()


def test_read_only_root_missing_artifacts_and_stamp(small_root, monkeypatch):
    def read_only(self, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(atomic.Path, "mkdir", read_only)
    code, out = run("metadata", "plan", small_root, "--world-size", "2")
    assert code == 2
    (line,) = error_lines(out)
    assert "/meta: cannot create folder: Read-only file system" in line
    monkeypatch.undo()
    assert run("prepare", small_root, *PREP)[0] == 0
    (small_root / "meta/episodekit_validation.json").unlink()

    real_open = open

    def no_write(path, mode="r", *a, **k):
        if "w" in mode and "episodekit_validation" in str(path):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, mode, *a, **k)

    monkeypatch.setattr("builtins.open", no_write)
    code, out = run("prepare", small_root, *PREP)
    assert code == 2, out
    (line,) = error_lines(out)
    assert "episodekit_validation.json: cannot write: Read-only file system" in line


def test_failed_rowgroups_step_is_named_in_the_summary(make_sample, monkeypatch):
    root = make_sample(episodes=20, tasks=2, seed=8)

    def broken(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(rw, "verify_written", broken)
    code, out = run("prepare", root, *PREP, "--target-mb", "0.05", "--jobs", "1")
    assert code == 1
    assert "prepare FAILED at step rowgroups" in out
    assert "validation FAILED" not in out
    assert "Input/output error" in out
    assert temporaries(root) == []


def test_unreadable_info_is_one_line(small_root):
    info = small_root / "meta/info.json"
    info.unlink()
    info.mkdir()  # reading it fails with EISDIR
    proc = subprocess.run(
        [sys.executable, "-c", "from episodekit.cli import main; main()", "info", str(small_root)],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "info.json: cannot read" in proc.stderr
