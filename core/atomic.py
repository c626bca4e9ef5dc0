"""Atomic file writes: a unique temporary name in the target folder, fsync, then ``os.replace``.

Every artifact episodekit writes goes through here, so a reader never sees a half-written file
under its final name, and several writers (ranks, processes) racing on one path leave exactly one
complete file behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

from episodekit.core.errors import os_problem
from episodekit.core.lifeline import check_parent

TMP_MARKER = ".tmp-"


def temp_path_for(path: str | os.PathLike) -> Path:
    """A unique temporary sibling of ``path`` (same folder, so ``os.replace`` is atomic)."""
    p = Path(path)
    return p.with_name(f".{p.name}{TMP_MARKER}{uuid.uuid4().hex}")


_TEMP_NAME = re.compile(r"^\..+" + re.escape(TMP_MARKER) + r"[0-9a-f]{32}$")


def is_temp_name(name: str) -> bool:
    """True for names produced by :func:`temp_path_for` (``.NAME.tmp-`` + 32 hex digits, a
    uuid4: no user names a file so), the only files a clean-up removes by name."""
    return bool(_TEMP_NAME.match(name))


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush a folder's entry table so a rename survives a power cut (best effort)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# Test-only crash hook: when this variable is set and its value occurs in a target path, the
# process kills itself (SIGKILL) just before that ``os.replace`` (tests/test_crash_harness.py).
KILL_HOOK_ENV = "EPISODEKIT_TEST_KILL_BEFORE_REPLACE"


def _maybe_die_before_replace(final: Path) -> None:
    needle = os.environ.get(KILL_HOOK_ENV)
    if needle and needle in str(final):
        os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on success fsync it and move it over ``path``.

    On any exception the temporary is removed (a failing removal never hides the first error)
    and ``path`` is left as it was. An ``OSError`` becomes one error naming the file and the
    operation (:func:`episodekit.core.errors.os_problem`: exit 2 for disk full, read-only,
    permission).
    """
    final = Path(path)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_problem(exc, final.parent, "create folder") from exc
    tmp = temp_path_for(final)
    try:
        try:
            yield tmp
        except OSError as exc:
            raise os_problem(exc, final, "write") from exc
        try:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        except OSError as exc:
            raise os_problem(exc, final, "write") from exc
        _maybe_die_before_replace(final)
        check_parent()  # a pool worker whose command is gone publishes nothing
        try:
            os.replace(tmp, final)
        except OSError as exc:
            raise os_problem(exc, final, "replace") from exc
        fsync_dir(final.parent)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)  # an OSError here is turned into one clear error by atomic_path


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def remove_temporaries(folder: str | os.PathLike, recursive: bool = True) -> list[Path]:
    """Delete leftover temporaries (from a crashed writer) under ``folder``; return what went.

    Symlinked folders are not entered (nothing outside ``folder`` is touched). Call it only while
    holding the folder's writer lock (:func:`episodekit.core.lock.writer_lock`)."""
    root = Path(folder)
    if not root.is_dir():
        return []
    removed = []
    for dirpath, _dirs, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            p = Path(dirpath) / name
            if is_temp_name(name) and not p.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
                    removed.append(p)
        if not recursive:
            break
    return removed
