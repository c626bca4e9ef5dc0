"""Signals at any moment of a command, sent as a user or a supervisor sends them (issues 39 and
41): SIGINT (Ctrl-C) exits 130, SIGTERM 143, with nothing half-written under a final name, no
temporary or staging folder left, the source unchanged, and no process of the command alive
1 s after it exits; after ``kill -9`` no process of it survives either (pool workers die with it
and stop writing) and its pipes close.

Each command runs once to the end (its duration T and its last line), then is signalled at a
spread of moments over [0, T]: imports, pool start-up, the per-file work in processes and
threads, duckdb queries, publishing, the summary. T and the moments count from when the CLI
handles signals itself (``SigCgt`` in ``/proc/PID/status`` has SIGTERM, which the bare
interpreter leaves alone): before that, for the first tens of milliseconds, the process is
Python starting up, and a signal gets Python's own treatment (docs/exit-codes.md).

When is another outcome than 130 right after a SIGINT? Only when the command had finished its
work before the signal. The test reads what the command printed (without blocking) right before
it sends the signal; only if the command's last line, which it prints after all its work, was
already there (or the process was gone) does it accept 0 (the process ended before the signal
landed) or death by the signal itself (-2: it landed in Python's last moments, after the
interpreter put the default handlers back). Every other run must exit exactly 130: the CLI
records the signal and maps any run that received one to 130, whatever swallowed it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from episodekit.core.atomic import is_temp_name
from episodekit.sample import write_sample

psutil = pytest.importorskip("psutil")

EPISODEKIT = [sys.executable, "-m", "episodekit.cli"]
LOCK = ".episodekit.lock"
# Moments to signal at, as fractions of the command's uninterrupted run time.
SPREAD = (0.03, 0.15, 0.3, 0.5, 0.7, 0.9)

# name: (arguments after ROOT, the line printed once the work is done). {out}: the output folder.
COMMANDS = {
    "validate": ([], "errors,"),
    "prepare --frames": (
        ["--out", "{out}", "--frames", "--world-size", "8", "--jobs", "2"],
        "files changed in",
    ),
    "prep rowgroups --out": (["--out", "{out}", "--jobs", "2"], "failed 0;"),
    "edit": (["--out", "{out}", "--drop-episodes", "0"], "wrote "),
}
WORDS = {"prep rowgroups --out": ["prep", "rowgroups"], "prepare --frames": ["prepare"]}


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """60 episodes in 4 data files: the per-file steps run in a pool of two workers."""
    root = tmp_path_factory.mktemp("signals") / "src"
    return write_sample(root, episodes=60, tasks=3, seed=7, data_files_size_in_mb=1)


@dataclass
class Run:
    code: int
    done_before: bool  # the command's last line was printed before the signal
    stdout: str
    stderr: str
    left: list[str]  # processes of the command still alive 1 s after it exited


def _env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "EPISODEKIT_DEBUG"}
    env["EPISODEKIT_CACHE"] = str(tmp / "cache")  # the frame store goes here
    return env


def _argv(name: str, root: Path, out: Path) -> list[str]:
    extra, _ = COMMANDS[name]
    words = WORDS.get(name, [name])
    return [*words, str(root), *[str(out) if a == "{out}" else a for a in extra]]


def _session(sid: int) -> list[str]:
    """The live (not zombie) processes of session ``sid``."""
    found = []
    for p in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if os.getsid(p.pid) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}")
        except (OSError, psutil.Error):
            continue
    return found


def _gone_within(sid: int, seconds: float = 1.0) -> list[str]:
    """Poll until no process of session ``sid`` is alive, at most ``seconds``; what is left."""
    deadline = time.monotonic() + seconds
    while True:
        left = _session(sid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _read_ready(stream) -> bytes:
    """What the pipe holds now, without waiting."""
    fd = stream.fileno()
    os.set_blocking(fd, False)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.set_blocking(fd, True)
    return b"".join(chunks)


def _handles_signals(pid: int) -> bool:
    """True once the CLI has installed its own handlers (SIGTERM in ``SigCgt``)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            caught = next(int(ln.split()[1], 16) for ln in fh if ln.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def start(args: list[str], env: dict) -> subprocess.Popen:
    """The CLI in its own session, once it handles signals (see the module docstring)."""
    proc = subprocess.Popen(
        [*EPISODEKIT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    deadline = time.monotonic() + 60
    while not _handles_signals(proc.pid) and proc.poll() is None:
        assert time.monotonic() < deadline, "the CLI never took over its signals"
        time.sleep(0.002)
    return proc


def signal_at(args: list[str], delay: float, sig: int, done_line: str, env: dict) -> Run:
    """Start the CLI, send ``sig`` ``delay`` seconds after it handles signals (if it is still
    running), wait for it, and for its processes to be gone."""
    proc = start(args, env)
    try:
        time.sleep(delay)
        early = _read_ready(proc.stdout)
        done_before = done_line in early.decode(errors="replace") or proc.poll() is not None
        if proc.poll() is None:
            os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    left = _gone_within(proc.pid)
    return Run(proc.returncode, done_before, (early + out).decode(), err.decode(), left)


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` (the writer lock aside): size and mtime."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file() and p.name != LOCK
    }


def assert_nothing_half_written(folder: Path) -> None:
    """No temporary anywhere under ``folder``; every parquet, json and jsonl file complete; every
    frame store folder has its manifest (the last file a store gets)."""
    for p in folder.rglob("*"):
        assert not is_temp_name(p.name), p
        if p.is_dir() and p.parent.name == "frames":
            assert (p / "manifest.json").is_file(), f"a frame store without manifest: {p}"
        if not p.is_file():
            continue
        if p.suffix == ".parquet":
            pq.read_table(p)
        elif p.suffix == ".json":
            json.loads(p.read_text())
        elif p.suffix == ".jsonl":
            for line in p.read_text().splitlines():
                json.loads(line)


def _spread(name: str, src: Path, tmp: Path, sig: int, fractions=SPREAD) -> list[Run]:
    """Run ``name`` once to the end, then signalled at ``fractions`` of its run time; check
    each run's output folder (missing, or every file of the uninterrupted run: staged outputs
    are published whole or not at all), the source, and the folder around them."""
    env = _env(tmp)
    work = tmp / "work"
    work.mkdir()
    _, done_line = COMMANDS[name]
    out = work / "out"
    full = start(_argv(name, src, out), env)
    t0 = time.monotonic()
    stdout, stderr = full.communicate(timeout=300)
    seconds = time.monotonic() - t0
    assert full.returncode == 0 and done_line in stdout.decode(), stdout + stderr
    source = _snapshot(src)
    published = set(_snapshot(out)) if out.exists() else set()
    runs = []
    for f in fractions:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(tmp / "cache", ignore_errors=True)
        before = set(os.listdir(work))
        run = signal_at(_argv(name, src, out), f * seconds, sig, done_line, env)
        where = f"{name} signalled at {f:.2f} x {seconds:.1f} s: exit {run.code}\n{run.stderr}"
        assert run.code == 128 + sig or (run.done_before and run.code in (0, -sig)), where
        assert "Traceback" not in run.stderr, where
        if run.code == 128 + sig:
            assert "Error: interrupted" in run.stderr, where
        assert not run.left, f"{where}\nstill running: {run.left}"
        assert set(os.listdir(work)) <= before | {"out"}, f"{where}: {os.listdir(work)}"
        assert_nothing_half_written(work)
        got = set(_snapshot(out)) if out.exists() else set()
        assert got in (set(), published), f"{where}: a partial output {sorted(got)}"
        if (tmp / "cache").exists():
            assert_nothing_half_written(tmp / "cache")
        assert _snapshot(src) == source, f"{where}: the source changed"
        runs.append(run)
    return runs


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_sigint_at_any_moment_is_130(name, src, tmp_path):
    runs = _spread(name, src, tmp_path, signal.SIGINT)
    assert sum(r.code == 130 for r in runs) >= len(runs) // 2  # most moments were mid-work


def test_sigterm_is_143_and_stops_the_pool(src, tmp_path):
    runs = _spread(
        "prep rowgroups --out", src, tmp_path, signal.SIGTERM, fractions=(0.15, 0.5, 0.8)
    )
    assert any(r.code == 143 for r in runs)
    assert all("(SIGTERM)" in r.stderr for r in runs if r.code == 143)


def _workers(pid: int) -> list:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [k for k in kids if "multiprocessing.spawn" in " ".join(k.cmdline())]


@pytest.mark.parametrize("name", ["prep rowgroups --out", "prepare --frames"])
def test_kill_9_leaves_no_worker_and_no_writer(name, src, tmp_path):
    """kill -9 while the pool works: within 1 s no process of the command is alive, the
    caller's pipes close (communicate returns) and nothing changes in the output afterwards."""
    out = tmp_path / "out"
    proc = start(_argv(name, src, out), _env(tmp_path))
    try:
        deadline = time.monotonic() + 60
        while not _workers(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _workers(proc.pid), "the pool never started"
        time.sleep(0.2)  # the workers are at work
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)  # every holder of the pipes is gone
        assert not _gone_within(proc.pid), _session(proc.pid)
        after = _snapshot(out) if out.exists() else {}
        time.sleep(1.0)
        assert (_snapshot(out) if out.exists() else {}) == after  # nobody writes any more
    finally:
        if proc.poll() is None or _session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
