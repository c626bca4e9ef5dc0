"""Test-only crash points: named places in the write paths where a test makes the process kill
or signal itself, to check what a ``kill -9`` or a Ctrl-C at that very moment leaves.

The write paths that must survive a crash (the publish of a staged folder, the writer lock,
``repair --in-place`` and ``--restore``) call :func:`reached` before each change they make to
the disk. Unset (always, outside tests) it costs one environment lookup. Set
:data:`CRASH_ENV` to ``SIGNAL:N`` (``KILL:7``, ``INT:7``, ``TERM:7``) and the process sends
itself that signal at the N-th point it reaches; set :data:`LOG_ENV` to a file and every point
reached is appended to it (``N name``), so a test learns how many there are and sweeps them
all (tests/app/test_crash_sweep.py).
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "EPISODEKIT_TEST_CRASH_AT"
LOG_ENV = "EPISODEKIT_TEST_CRASH_LOG"
NO_EXCHANGE_ENV = "EPISODEKIT_TEST_NO_EXCHANGE"  # publish by two renames, as where there is no
# renameat2(RENAME_EXCHANGE) (core/staging.py), so a sweep covers that way too
_count = 0


def reached(name: str) -> None:
    """A crash point: count it, log it, and signal this process when it is the one asked for."""
    at, log = os.environ.get(CRASH_ENV), os.environ.get(LOG_ENV)
    if not at and not log:
        return
    global _count
    _count += 1
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{_count} {name}\n")
    if at:
        sig, _, n = at.partition(":")
        if n.isdigit() and int(n) == _count:
            os.kill(os.getpid(), getattr(signal, f"SIG{sig}"))
