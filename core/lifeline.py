"""A worker process's tie to the process that started it: it dies with it, and never publishes a
file once it is gone.

The executor's pool workers call :func:`follow` first thing (Ray's task workers only
:func:`die_with_parent`, tied to their raylet: they keep Ray's own signal handling). Then:

- on Linux the kernel kills the worker (SIGKILL, ``PR_SET_PDEATHSIG``) the moment its parent
  dies, ``kill -9`` included; elsewhere a daemon thread notices within ``POLL_S`` and exits. A
  parent that died before the worker got this far is seen by the ``getppid`` check right after.
  Nothing is left running, writing into an output folder, or holding the caller's pipes (a
  ``subprocess.communicate()`` on the command returns when the command dies);
- :func:`check_parent` (called by :func:`episodekit.core.atomic.atomic_path` right before its
  ``os.replace``) refuses to publish for a parent that is gone: a last guard where neither of
  the above is available;
- SIGINT is ignored (Ctrl-C in a terminal reaches the whole process group: stopping the work is
  the parent's decision, :mod:`episodekit.core.executor`), and SIGTERM stops the worker: a
  running job unwinds first (its atomic writes remove their temporaries), an idle worker exits;
- the worker's stdin and stdout are ``/dev/null`` (a library that prints cannot corrupt the
  parent's ``--json`` output); stderr stays the parent's, for warnings.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

from episodekit.core.interrupt import Interrupted, in_native_import

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 0.2  # where the kernel cannot tie the worker to its parent: how often it checks
ORPHAN_EXIT = 1  # the exit code of a worker that outlived its parent (nobody reads it)

_parent: int | None = None  # the pid this process follows (None: not a worker)
_busy = False  # a job is running
_stopping = False  # SIGTERM arrived


class ParentGone(BaseException):
    """The process this worker works for is gone: stop without publishing anything (a
    ``BaseException``, so the per-file ``except Exception`` reports do not swallow it)."""


def kill_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def follow(parent_pid: int) -> None:
    """Tie this pool worker to ``parent_pid`` (see the module docstring)."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    _quiet_stdio()


def die_with_parent(parent_pid: int) -> None:
    """End this process when ``parent_pid`` (its parent) dies, and let :func:`check_parent` see
    it gone; nothing else (a Ray worker keeps Ray's own signal handling)."""
    global _parent
    if _parent is not None:
        return
    _parent = parent_pid
    tied = kill_with_parent()
    if os.getppid() != parent_pid:  # the parent died before we were tied to it
        os._exit(ORPHAN_EXIT)
    if not tied:
        threading.Thread(target=_watch, name="episodekit-lifeline", daemon=True).start()


def _quiet_stdio() -> None:
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)


def _watch() -> None:
    while parent_alive():
        time.sleep(POLL_S)
    os._exit(ORPHAN_EXIT)


def _on_term(signum: int, frame: FrameType | None) -> None:
    global _stopping
    _stopping = True
    if _busy and not in_native_import(frame):  # (raised into a native module's init: abort)
        raise Interrupted(signum)  # the job unwinds: its atomic writes remove their temporaries
    os._exit(128 + signum)


def parent_alive() -> bool:
    """False when this is a worker whose parent is gone (True in any other process)."""
    return _parent is None or os.getppid() == _parent


def check_parent() -> None:
    """Raise :class:`ParentGone` in a worker whose parent is gone (before publishing a file)."""
    if not parent_alive():
        raise ParentGone(f"the process {_parent} this worker works for is gone")


@contextlib.contextmanager
def job() -> Iterator[None]:
    """Around one job in a worker: SIGTERM then interrupts the job (instead of ending an idle
    worker), and the worker exits once the job has unwound."""
    global _busy
    if _stopping:
        os._exit(128 + signal.SIGTERM)
    _busy = True
    try:
        yield
    finally:
        _busy = False
        if _stopping:
            os._exit(128 + signal.SIGTERM)
