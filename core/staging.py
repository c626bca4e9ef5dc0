"""Folders built next to an output and swapped into place: names no user has, a marker we
wrote, and a publish that puts everything under the final name at once or nothing.

A command that replaces a whole folder (``--out`` of the dataset writers, ``prep rowgroups
--out``, ``prepare --out``, ``sample``, the frame store) builds it in a hidden sibling
``.<out>.episodekit-<kind>-<token>`` (``kind`` is ``partial`` for a build, ``old`` for the
output it replaces; ``token`` is random, 32 hex digits) holding :data:`STAGING_MARKER`, a small
JSON file naming the token, the output and the writer (pid, host). Clean-up lists the parent
folder and removes an entry only when its name has exactly that form for this output AND its
marker holds the same token and output name AND its writer is gone: never by pattern, so a
user's ``out.old-backup`` or ``.out.episodekit-partial-<hex>`` without our marker is never
touched. :func:`publish` swaps the staging folder into place (one ``renameat2(RENAME_EXCHANGE)``
where the filesystem has it, else two renames), so the final name holds the old output or the
new one, never a partial one.

An in-place repair keeps the files it replaced in a ``backup`` folder of the same form
(:func:`new_backup`): the user's way back (``repair ROOT --restore``), so clean-up never
removes one; only a restore does.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import socket
import uuid
from pathlib import Path

from episodekit.core import interrupt
from episodekit.core.errors import EnvironmentProblem

STAGING_MARKER = ".episodekit-staging"  # inside every staging/backup folder: whose it is
KINDS = ("partial", "old", "backup")
STALE_KINDS = ("partial", "old")  # what a killed run leaves; a backup is kept for the user
_NAME = re.compile(r"^episodekit-(partial|old|backup)-([0-9a-f]{32})$")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


# Test-only crash hook: when set and its value occurs in the output's path, the process kills
# itself (SIGKILL) right after the swap, before the replaced output is deleted.
KILL_AFTER_SWAP_ENV = "EPISODEKIT_TEST_KILL_AFTER_SWAP"


def _maybe_die_after_swap(out: Path) -> None:
    needle = os.environ.get(KILL_AFTER_SWAP_ENV)
    if needle and needle in str(out):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def staging_path(out: Path, kind: str, token: str) -> Path:
    """The sibling of ``out`` a build (``partial``), a replaced output (``old``) or the files an
    in-place repair replaced (``backup``) live in."""
    return out.with_name(f".{out.name}.episodekit-{kind}-{token}")


def _marker_text(out: Path, token: str) -> str:
    who = {"token": token, "out": out.name, "pid": os.getpid(), "host": socket.gethostname()}
    return json.dumps(who) + "\n"


def _write_marker(folder: Path, out: Path, token: str) -> None:
    (folder / STAGING_MARKER).write_text(_marker_text(out, token))


def new_staging(out: str | os.PathLike) -> Path:
    """Create a fresh, marked staging folder for ``out`` (its parent must exist)."""
    out = Path(out)
    if out.is_dir() and out.stat().st_dev != out.parent.stat().st_dev:
        raise EnvironmentProblem(
            "is a mount point: the output is built next to it and swapped in, which cannot "
            "cross filesystems; give a folder inside it",
            str(out),
        )
    return _new(out, "partial", "create the staging folder")


def new_backup(out: str | os.PathLike) -> Path:
    """Create a fresh, marked backup folder next to ``out`` (kept until the user restores or
    deletes it: :func:`remove_stale` leaves it alone)."""
    return _new(Path(out), "backup", "create the backup folder")


def _new(out: Path, kind: str, operation: str) -> Path:
    token = uuid.uuid4().hex
    path = staging_path(out, kind, token)
    try:
        path.mkdir()
        _write_marker(path, out, token)
    except OSError as exc:
        with contextlib.suppress(OSError):
            shutil.rmtree(path)
        raise _problem(exc, path, operation) from exc
    return path


def _problem(exc: OSError, path: Path, operation: str) -> EnvironmentProblem:
    """Staging and publishing fail for the environment's reasons, never the data's: exit 2."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    out = EnvironmentProblem(f"cannot {operation}: {reason}", str(path))
    out.errno = exc.errno  # type: ignore[attr-defined]
    return out


def _token_of(entry: str, out: Path) -> str | None:
    """The token of ``entry`` when it is named as one of ``out``'s staging folders, else None."""
    named = _named(entry, out)
    return named[1] if named else None


def _named(entry: str, out: Path) -> tuple[str, str] | None:
    """``(kind, token)`` of ``entry`` when it is named as one of ``out``'s folders, else None."""
    prefix = f".{out.name}."
    if not entry.startswith(prefix):
        return None
    m = _NAME.match(entry[len(prefix) :])
    return (m.group(1), m.group(2)) if m else None


def _marker(folder: Path) -> dict | None:
    try:
        doc = json.loads((folder / STAGING_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def owned(folder: str | os.PathLike, out: str | os.PathLike) -> bool:
    """Whether ``folder`` is one of ``out``'s staging/backup folders: named so, a real folder
    (not a link), holding our marker with the token of its name and ``out``'s name."""
    folder, out = Path(folder), Path(out)
    token = _token_of(folder.name, out)
    if token is None or folder.parent != out.parent:
        return False
    if folder.is_symlink() or not folder.is_dir():
        return False
    doc = _marker(folder)
    return bool(doc) and doc.get("token") == token and doc.get("out") == out.name


def is_backup(folder: str | os.PathLike, out: str | os.PathLike) -> bool:
    """Whether ``folder`` is a backup folder of ``out`` made by :func:`new_backup`."""
    named = _named(Path(folder).name, Path(out))
    return bool(named) and named[0] == "backup" and owned(folder, out)


def _writer_gone(doc: dict) -> bool:
    if doc.get("host") != socket.gethostname():
        return False  # another machine's writer: we cannot tell; leave it
    pid = doc.get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return False  # unreadable, or this very process: in use
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def remove_stale(out: str | os.PathLike) -> list[Path]:
    """Remove ``out``'s staging folders (and replaced outputs) whose writer is gone (a killed
    run's); return them. Only :func:`owned` folders are candidates; anything else next to
    ``out`` stays, and so do backups (the user's way back)."""
    out = Path(out)
    try:
        names = os.listdir(out.parent)
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        p = out.parent / name
        named = _named(name, out)
        if named is None or named[0] not in STALE_KINDS or not owned(p, out):
            continue
        if _writer_gone(_marker(p) or {}):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def discard(staging: str | os.PathLike, out: str | os.PathLike) -> None:
    """Remove a staging folder this run created (only when it still is one of ours)."""
    if owned(staging, out):
        shutil.rmtree(staging, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def publish(staging: str | os.PathLike, out: str | os.PathLike, attempts: int = 20) -> None:
    """Put the complete ``staging`` folder at ``out``, replacing what is there (a folder the
    caller checked is ours), and delete the replaced one. ``out`` holds the old content or the
    new, never a mix; a run killed in between leaves only marked folders :func:`remove_stale`
    removes. Concurrent publishers of one ``out`` (frame stores) retry; the last one wins.
    SIGINT/SIGTERM cannot cut the swap (:func:`episodekit.core.interrupt.deferred`): one that
    arrives during it is raised once the new output is in place."""
    staging, out = Path(staging), Path(out)
    named = _named(staging.name, out)
    if named is None or named[0] != "partial":
        raise ValueError(f"{staging} is not a staging folder of {out}")
    token = named[1]
    swapped = False
    try:
        with interrupt.deferred():  # a signal in the swap is raised once the new output is in
            _swap(staging, out, token, attempts)
            swapped = True
    finally:
        if swapped:  # (also when that signal is being raised: the replaced output goes)
            _maybe_die_after_swap(out)
            for p in (staging, staging_path(out, "old", token)):
                if p.is_dir() and not p.is_symlink():  # the replaced output, ours by its marker
                    shutil.rmtree(p, ignore_errors=True)


def _swap(staging: Path, out: Path, token: str, attempts: int) -> None:
    """Put ``staging`` at ``out``; what ``out`` held moves to a marked name of ``token``. Runs
    as one deferred section: between two renames ``out`` does not exist, and a signal must not
    leave it so."""
    try:
        for _ in range(attempts):
            if out.is_dir() and not out.is_symlink():
                # the replaced output takes a marked name: a kill before it is deleted leaves
                # a folder the next run recognizes as ours
                _write_marker(out, out, token)
                if _exchange(staging, out):
                    break
                old = staging_path(out, "old", token)
                if old.is_dir():  # replaced in an earlier attempt of this call
                    shutil.rmtree(old, ignore_errors=True)
                with contextlib.suppress(FileNotFoundError):
                    os.rename(out, old)
            try:
                os.rename(staging, out)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY) and out.exists():
                    continue  # another publisher got in between: swap again
                raise
            break
        else:
            raise OSError(errno.EBUSY, "other writers kept replacing it", str(out))
    except OSError as exc:
        raise _problem(exc, out, "publish") from exc
    _fsync_dir(out.parent)
    with contextlib.suppress(OSError):
        (out / STAGING_MARKER).unlink()  # the new output's staging marker: it is published


SKIP_SEED = {STAGING_MARKER, ".episodekit.lock"}  # the writer's own files are never carried


def seed_from(
    out: str | os.PathLike,
    staging: str | os.PathLike,
    only: set[str] | None = None,
    skip: set[str] | frozenset[str] = frozenset(),
) -> int:
    """Hard-link the files of an earlier output at ``out`` into ``staging`` (same tree), so a
    rerun that updates an output rewrites only what changed and still publishes all at once.
    Safe because every episodekit write replaces a file (new inode), never edits one in place.
    ``only``: the relative paths to carry (None: all); ``skip``: relative paths never carried
    (an earlier copy of a file the source no longer has). Returns the number linked; nothing
    where the filesystem has no hard links (the run then writes everything)."""
    out, staging = Path(out), Path(staging)
    if not out.is_dir() or out.is_symlink():
        return 0
    n = 0
    for dirpath, dirs, files in os.walk(out, followlinks=False):
        rel_dir = Path(dirpath).relative_to(out)
        dirs[:] = [d for d in dirs if not (Path(dirpath) / d).is_symlink()]
        for name in files:
            rel = (rel_dir / name).as_posix()
            src = Path(dirpath) / name
            if name in SKIP_SEED or src.is_symlink() or rel in skip:
                continue
            if only is not None and rel not in only:
                continue
            dst = staging / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except FileExistsError:
                continue
            except OSError as exc:
                if exc.errno in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EMLINK):
                    return n
                raise
            n += 1
    return n
