"""Signal a command at many moments and tally what it did: the exit codes, how often it still
printed a result, how long it took to exit, and any of its processes alive 1 s later.

    .venv/bin/episodekit sample /tmp/s2500 --episodes 2500
    .venv/bin/python scripts/probe_interrupt.py --tries 16 --from 0.3 --to 0.6 -- \\
        validate /tmp/s2500
    .venv/bin/python scripts/probe_interrupt.py --signal TERM --tries 8 --from 1 --to 8 \\
        --reset /tmp/out -- prep rowgroups /tmp/s2500 --out /tmp/out

Moments are seconds after the process started, spread evenly over [--from, --to]. A run that
exits 0 with its result printed ("OK:", "PASSED", "files changed", "rewritten", "wrote ") at a
moment well before its usual run time ignored the signal. --reset DIR removes DIR before each
try (an --out folder). Needs psutil (the dev extras).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil

RESULT_MARKERS = ("OK:", "PASSED", "files changed", "rewritten", "wrote ")


def _session(sid: int) -> list[int]:
    """Live processes of session ``sid`` (the command and anything it started)."""
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getsid(p.pid) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (OSError, psutil.Error):
            continue
    return out


def probe(args: list[str], delay: float, sig: int) -> tuple[int, bool, float, list[int]]:
    """(exit code, printed a result, seconds from signal to exit, processes left after 1 s)."""
    cmd = [sys.executable, "-m", "episodekit.cli", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    time.sleep(delay)
    sent = time.monotonic()
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    out, _ = proc.communicate(timeout=600)
    took = time.monotonic() - sent
    time.sleep(1.0)
    left = _session(proc.pid)
    for pid in left:  # do not leave them running
        os.kill(pid, signal.SIGKILL)
    printed = any(m in out.decode(errors="replace") for m in RESULT_MARKERS)
    return proc.returncode, printed, took, left


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--signal", default="INT", choices=["INT", "TERM", "KILL"])
    ap.add_argument("--tries", type=int, default=16)
    ap.add_argument("--from", dest="lo", type=float, default=0.3)
    ap.add_argument("--to", dest="hi", type=float, default=0.6)
    ap.add_argument("--reset", default=None, help="a folder removed before each try")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = a.command[1:] if a.command[:1] == ["--"] else a.command
    sig = getattr(signal, f"SIG{a.signal}")
    tally: collections.Counter = collections.Counter()
    for k in range(a.tries):
        if a.reset:
            shutil.rmtree(a.reset, ignore_errors=True)
        delay = a.lo + (a.hi - a.lo) * k / max(1, a.tries - 1)
        code, printed, took, left = probe(args, delay, sig)
        tally[(code, printed)] += 1
        print(
            f"{delay:6.2f} s: exit {code:4d}{' result printed' if printed else ''}, "
            f"exited {took:.2f} s after the signal{f', left running: {left}' if left else ''}"
        )
    print("exit code, result printed: tries", dict(tally))


if __name__ == "__main__":
    main()
