"""One writer per root: an exclusive lock file, and the clean-up of crashed writers' temporaries.

Every command that writes into a local root (or ``--out``) holds ``<folder>/.episodekit.lock``
(the ``filelock`` package: ``flock``, released by the OS when the process dies, so a ``kill -9``
never leaves a stale lock). A second writer waits, saying so, or raises
:class:`~episodekit.core.errors.EnvironmentProblem` (exit 2) when told not to wait. Leftover
temporaries (:data:`~episodekit.core.atomic.TMP_MARKER`) are removed only while the lock is held,
so a live writer's temporary is never deleted under it. Re-entrant within a process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from episodekit.core.atomic import remove_temporaries
from episodekit.core.errors import EnvironmentProblem, os_problem

LOCK_NAME = ".episodekit.lock"
CLEAN_FOLDERS = ("data", "meta", "videos")  # where episodekit writes inside a root
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
_held: dict[str, int] = {}  # realpath -> depth (re-entrant within one process)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def writer_lock(
    folder: str | os.PathLike, wait: bool = True, say: Callable[[str], None] | None = None
) -> Iterator[list[Path]]:
    """Hold the exclusive writer lock of the local ``folder`` (created if absent) and yield the
    leftover temporaries removed under its data/, meta/ and videos/ on the first acquisition.

    ``wait=False``: raise :class:`EnvironmentProblem` at once when another process holds it. A
    read-only folder is not locked (nothing can be written there; the writes report it).
    """
    from filelock import FileLock, Timeout

    key = os.path.realpath(folder)
    if key in _held:
        _held[key] += 1
        try:
            yield []
        finally:
            _held[key] -= 1
        return
    path = os.path.join(key, LOCK_NAME)
    try:
        os.makedirs(key, exist_ok=True)
        lock = FileLock(path)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            if not wait:
                raise EnvironmentProblem(
                    "another episodekit process is writing here (its lock is held); "
                    "wait for it, or run again without --no-wait to queue behind it",
                    path,
                ) from None
            (say or _stderr)(f"waiting for another episodekit process writing to {key} ...")
            lock.acquire()
    except OSError as exc:
        if exc.errno in _READ_ONLY:
            yield []  # read-only: no writer can run here; the writes themselves report it
            return
        raise os_problem(exc, path, "take the writer lock") from exc
    _held[key] = 1
    try:
        removed: list[Path] = []
        for sub in CLEAN_FOLDERS:
            with contextlib.suppress(OSError):  # a clean-up problem never stops the real work
                removed += remove_temporaries(os.path.join(key, sub))
        yield removed
    finally:
        del _held[key]
        lock.release()


def remove_if_only_lock(folder: str | os.PathLike) -> None:
    """Remove ``folder`` when it holds nothing but our lock file: a failed first write into a
    new folder leaves no folder behind. Anything else in it keeps it (never ours to delete)."""
    with contextlib.suppress(OSError):
        if os.path.isdir(folder) and set(os.listdir(folder)) <= {LOCK_NAME}:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, LOCK_NAME))
            os.rmdir(folder)
