"""One writer per root: an exclusive lock file, and the clean-up of crashed writers' temporaries.

Every command that writes into a local root (or ``--out``) holds the folder's writer lock: an
``flock`` on the file ``.<name>.episodekit.lock`` NEXT TO the folder (``<name>`` is the
folder's own name, symlinks resolved), not inside it. So the lock

- never changes the folder it guards: a root written in place has no lock file in it, and a new
  ``--out`` does not exist until its staged content is published (a run killed before that
  leaves no folder holding only a lock file);
- guards the path, not one folder's inode: a publish that swaps a new folder in under the name
  does not change the lock a waiting writer queues on.

The file exists only while a writer holds it: the holder deletes it before releasing, and a
writer that wakes up holding a lock file no longer at that path (its holder deleted it) tries
again on the new one. The OS releases the lock when a process dies, so ``kill -9`` never leaves
a stale lock, only the (empty) file, which the next writer of that folder deletes when it is
done. Where the parent folder cannot be written (a read-only parent, a name too long for a
sibling), the lock file is ``<folder>/.episodekit.lock`` instead, by the same rules; a
read-only folder is not locked at all (nothing can be written there). A second writer waits,
saying so, or raises :class:`~episodekit.core.errors.EnvironmentProblem` (exit 2) when told
not to wait. Leftover temporaries (:data:`~episodekit.core.atomic.TMP_MARKER`) are removed
only while the lock is held, so a live writer's temporary is never deleted under it.
Re-entrant within a process.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from episodekit.core import crashpoint, interrupt
from episodekit.core.atomic import remove_temporaries
from episodekit.core.errors import EnvironmentProblem, os_problem

LOCK_NAME = ".episodekit.lock"  # inside the folder: the fallback (and older versions' place)
LOCK_SUFFIX = ".episodekit.lock"  # next to it: ``.<name>`` + this
CLEAN_FOLDERS = ("data", "meta", "videos")  # where episodekit writes inside a root
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
_NO_SIBLING = (*_READ_ONLY, errno.ENAMETOOLONG, errno.ENOENT)
_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)  # never through a link
_held: dict[str, int] = {}  # realpath -> depth (re-entrant within one process)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def lock_path(folder: str | os.PathLike) -> Path:
    """The lock file of ``folder`` (symlinks resolved): ``.<name>.episodekit.lock`` next to it."""
    real = Path(os.path.realpath(folder))
    return real.with_name(f".{real.name}{LOCK_SUFFIX}")


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (its holder did not delete it)."""
    try:
        here = os.lstat(path)
    except FileNotFoundError:
        return False
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | _FLAGS, 0o666)
    except PermissionError:
        if not os.path.isfile(path):
            raise
        return os.open(path, os.O_RDONLY | _FLAGS)  # another user's lock file: flock needs no write


def _lock(path: str, wait: bool, say: Callable[[str], None], key: str) -> int:
    """Open and ``flock`` ``path``; the open file once it is the one at ``path`` (see the module
    docstring). Raises OSError for what the environment refuses."""
    said = False
    while True:
        fd = _open(path)
        locked = False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    raise EnvironmentProblem(
                        "another episodekit process is writing here (its lock is held); "
                        "wait for it, or run again without --no-wait to queue behind it",
                        key,
                    ) from None
                if not said:
                    say(f"waiting for another episodekit process writing to {key} ...")
                    said = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            locked = True
            if _same_file(fd, path):
                return fd
        except BaseException:  # (a signal while waiting, or just after: no file left behind)
            if locked:
                _release(fd, path)
            else:
                os.close(fd)
            raise
        os.close(fd)  # its holder deleted it: queue on the one at the path now


def _acquire(key: str, wait: bool, say: Callable[[str], None]) -> tuple[int, str] | None:
    """The held lock of folder ``key`` (real path) and its file; None for a read-only folder."""
    parent, name = os.path.split(key)
    if name:
        sibling = os.path.join(parent, f".{name}{LOCK_SUFFIX}")
        try:
            os.makedirs(parent, exist_ok=True)
            return _lock(sibling, wait, say, key), sibling
        except OSError as exc:
            if exc.errno not in _NO_SIBLING:
                raise os_problem(exc, sibling, "take the writer lock") from exc
    inside = os.path.join(key, LOCK_NAME)  # the parent cannot hold it: inside the folder
    try:
        return _lock(inside, wait, say, key), inside
    except OSError as exc:
        if exc.errno in (*_READ_ONLY, errno.ENOENT):
            return None  # read-only (or no folder): no writer can run here; the writes report it
        raise os_problem(exc, inside, "take the writer lock") from exc


def _release(fd: int, path: str) -> None:
    """Delete the lock file (while still holding it), then release it."""
    with interrupt.deferred():  # a signal here would leave the file (harmless, but left)
        crashpoint.reached("lock: release")
        try:
            if _same_file(fd, path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
        finally:
            os.close(fd)


@contextlib.contextmanager
def writer_lock(
    folder: str | os.PathLike, wait: bool = True, say: Callable[[str], None] | None = None
) -> Iterator[list[Path]]:
    """Hold the exclusive writer lock of the local ``folder`` (see the module docstring: the
    folder itself is never created, only the folders above it) and yield the leftover
    temporaries removed under its data/, meta/ and videos/ on the first acquisition.

    ``wait=False``: raise :class:`EnvironmentProblem` at once when another process holds it. A
    read-only folder is not locked (nothing can be written there; the writes report it).
    """
    key = os.path.realpath(folder)
    if key in _held:
        _held[key] += 1
        try:
            yield []
        finally:
            _held[key] -= 1
        return
    crashpoint.reached("lock: take")
    held = _acquire(key, wait, say or _stderr)
    if held is None:
        yield []
        return
    try:
        _held[key] = 1
        crashpoint.reached("lock: taken")
        removed: list[Path] = []
        for sub in CLEAN_FOLDERS:
            with contextlib.suppress(OSError):  # a clean-up problem never stops the real work
                removed += remove_temporaries(os.path.join(key, sub))
        yield removed
    finally:
        _held.pop(key, None)
        _release(*held)


def remove_unheld_lock(folder: str | os.PathLike) -> bool:
    """Delete ``folder``'s lock file (next to it) when no process holds it: what a writer killed
    in a folder that is gone since left behind (a killed run's staging folder, removed by the
    next run's clean-up, is never written again, so no later writer of it deletes the file).
    Taken, deleted and released as a holder does, so a lock in use is never removed; whether
    one was removed."""
    path = str(lock_path(folder))
    try:
        fd = os.open(path, os.O_RDONLY | _FLAGS)
    except OSError:
        return False  # none (or not ours to open)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)  # held: its writer deletes it
        return False
    gone = _same_file(fd, path)
    _release(fd, path)
    return gone


def remove_if_only_lock(folder: str | os.PathLike) -> None:
    """Remove ``folder`` when it holds nothing but a lock file (an older version's, or the
    fallback's of a run killed in it): a failed first write into a new folder leaves no
    folder behind. Anything else in it keeps it (never ours to delete)."""
    with contextlib.suppress(OSError):
        if os.path.isdir(folder) and set(os.listdir(folder)) <= {LOCK_NAME}:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, LOCK_NAME))
            os.rmdir(folder)
