"""Folders built next to an output and swapped into place: names no user has, a marker we
wrote, and a publish that puts everything under the final name at once or nothing.

A command that replaces a whole folder (``--out`` of the dataset writers, ``prep rowgroups
--out``, ``prepare --out``, ``sample``, the frame store) builds it in a hidden sibling
``.<out>.episodekit-<kind>-<token>`` (``kind`` is ``partial`` for a build, ``old`` for the
output it replaces; ``token`` is random, 32 hex digits) holding :data:`STAGING_MARKER`, a small
JSON file naming the token, the output and the writer (pid, its start time, the boot id, the
pid namespace and the host: :func:`episodekit.core.spill.owner_record`). Clean-up lists the
parent folder and removes an entry only when its name has exactly that form for this output
AND its marker holds the same token and output name AND its writer is provably gone (dead,
a zombie, its pid reused, another boot: :func:`episodekit.core.spill.owner_gone`): never by
pattern, so a user's ``out.old-backup`` or ``.out.episodekit-partial-<hex>`` without our marker
is never touched. A folder is removed contents first and its marker last, then the folder
itself (:func:`remove_marked`): a removal cut short (a signal, ``kill -9``) leaves a folder that
is still marked, which the next run removes. :func:`publish` swaps the staging folder into
place (one ``renameat2(RENAME_EXCHANGE)`` where the filesystem has it, else two renames), so
the final name holds the old output or the new one, never a partial one.

An in-place repair keeps the files it replaced in a ``backup`` folder of the same form
(:func:`new_backup`, made whole under a ``partial`` name, then renamed): the user's way back
(``repair ROOT --restore``), so clean-up never removes one; only a restore does.
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
import stat
import uuid
from pathlib import Path

from episodekit.core import crashpoint, interrupt
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.lock import remove_unheld_lock
from episodekit.core.spill import owner_gone, owner_record

STAGING_MARKER = ".episodekit-staging"  # inside every staging/backup folder: whose it is
KINDS = ("partial", "old", "backup")
STALE_KINDS = ("partial", "old")  # what a killed run leaves; a backup is kept for the user
_NAME = re.compile(r"^episodekit-(partial|old|backup)-([0-9a-f]{32})$")
_MARKER_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
# Staging folders this process made and has not yet published, discarded or renamed (path ->
# its output): a signal can land between a folder's making and the caller's ``try`` that
# discards it, so whatever of these is still there, ours, when a command ends is removed
# (:func:`discard_unfinished`, run by :func:`episodekit.core.interrupt.run_command`).
_made: dict[Path, Path] = {}


# Test-only crash hook: when set and its value occurs in the output's path, the process kills
# itself (SIGKILL) right after the swap, before the replaced output is deleted (for a sweep
# over every step: core/crashpoint.py).
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
    return json.dumps({"token": token, "out": out.name, **owner_record()}) + "\n"


def _write_marker(folder: Path, out: Path, token: str) -> None:
    """Write the marker in one ``write`` (a ``kill -9`` leaves it whole or empty, never cut)."""
    fd = os.open(folder / STAGING_MARKER, _MARKER_FLAGS, 0o644)
    try:
        os.write(fd, _marker_text(out, token).encode())
    finally:
        os.close(fd)


def new_staging(out: str | os.PathLike) -> Path:
    """Create a fresh, marked staging folder for ``out`` (its parent must exist)."""
    out = Path(out)
    if out.is_dir() and out.stat().st_dev != out.parent.stat().st_dev:
        raise EnvironmentProblem(
            "is a mount point: the output is built next to it and swapped in, which cannot "
            "cross filesystems; give a folder inside it",
            str(out),
        )
    path = _new(out, "partial", "create the staging folder")
    crashpoint.reached("staging: made")  # (the caller has not taken it over yet)
    return path


def new_backup(out: str | os.PathLike, files: dict[str, str] | None = None) -> Path:
    """Create a fresh, marked backup folder next to ``out`` holding ``files`` (name -> text,
    e.g. its manifest), kept until the user restores or deletes it (:func:`remove_stale`
    leaves it alone). It is made under a ``partial`` name and renamed when whole: a backup
    never lacks those files, and one cut short is a staging folder the next run removes."""
    out = Path(out)
    path = _new(out, "partial", "create the backup folder")
    backup = path.with_name(path.name.replace("-partial-", "-backup-", 1))
    try:
        for name, text in (files or {}).items():
            crashpoint.reached("backup: write")
            (path / name).write_text(text)
        crashpoint.reached("backup: rename")
        os.rename(path, backup)
        _made.pop(path, None)
    except BaseException as exc:
        discard(path, out)
        if isinstance(exc, OSError):
            raise _problem(exc, path, "create the backup folder") from exc
        raise
    return backup


def _new(out: Path, kind: str, operation: str) -> Path:
    """A new folder of ``out``'s of ``kind``, marked. Made by ``mkdir`` then the marker: a
    ``kill -9`` in between leaves it empty (or with an empty marker), which :func:`remove_stale`
    removes as nothing's; so once marked it is checked to be still there (else made again)."""
    for _ in range(10):
        token = uuid.uuid4().hex
        path = staging_path(out, kind, token)
        _made[path] = out  # (before it exists: no moment where it is there and not listed)
        try:
            crashpoint.reached("staging: create")
            path.mkdir()
            crashpoint.reached("staging: mark")
            _write_marker(path, out, token)
            if (_marker(path) or {}).get("token") == token:
                return path
        except BaseException as exc:
            if isinstance(exc, FileNotFoundError) and path.parent.is_dir() and not path.exists():
                continue  # removed as empty by another run's clean-up before it was marked
            remove_marked(path)
            with contextlib.suppress(OSError):
                path.rmdir()  # (empty: the marker could not be written)
            if isinstance(exc, OSError):
                raise _problem(exc, path, operation) from exc
            raise
    raise EnvironmentProblem(f"cannot {operation}: other processes keep removing it", str(out))


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


def backups(out: str | os.PathLike) -> list[Path]:
    """The backup folders of ``out`` next to it (:func:`is_backup`), oldest name first."""
    out = Path(out)
    try:
        names = sorted(os.listdir(out.parent))
    except OSError:
        return []
    return [out.parent / n for n in names if is_backup(out.parent / n, out)]


def writer_gone(folder: str | os.PathLike) -> bool:
    """Whether the writer named in ``folder``'s marker is provably gone (see below)."""
    return _writer_gone(_marker(Path(folder)) or {})


def retire_backup(backup: str | os.PathLike, out: str | os.PathLike) -> None:
    """Remove a backup that has been put back: first it becomes a staging folder of this
    process (its marker rewritten, then renamed from ``backup`` to ``partial``, the same
    token), then it is removed marker last; a run killed on the way leaves a folder the next
    run removes, never a backup that is no longer one."""
    backup, out = Path(backup), Path(out)
    named = _named(backup.name, out)
    if named is None or named[0] != "backup" or not owned(backup, out):
        raise ValueError(f"{backup} is not a backup folder of {out}")
    token = named[1]
    partial = staging_path(out, "partial", token)
    with interrupt.deferred():
        crashpoint.reached("backup: take over")
        tmp = backup / f"{STAGING_MARKER}.new"
        tmp.write_text(_marker_text(out, token))
        os.replace(tmp, backup / STAGING_MARKER)
        crashpoint.reached("backup: retire")
        os.rename(backup, partial)
        remove_marked(partial)


def take_over(out: str | os.PathLike, wanted) -> Path | None:
    """A killed run's build of ``out`` to carry on (``partial``, ours by its marker, its writer
    provably gone) for which ``wanted(folder)`` holds, now marked as this process's (its
    marker rewritten atomically, the same token): :func:`remove_stale` then leaves it alone.
    None when there is none."""
    out = Path(out)
    try:
        names = sorted(os.listdir(out.parent))
    except OSError:
        return None
    for name in names:
        folder = out.parent / name
        named = _named(name, out)
        if named is None or named[0] != "partial" or not owned(folder, out):
            continue
        if not _writer_gone(_marker(folder) or {}) or not wanted(folder):
            continue
        tmp = folder / f"{STAGING_MARKER}.new"
        tmp.write_text(_marker_text(out, named[1]))
        os.replace(tmp, folder / STAGING_MARKER)
        return folder
    return None


def _writer_gone(doc: dict) -> bool:
    """Whether the writer a marker names is provably gone (:func:`~episodekit.core.spill.
    owner_gone`: no such process, a zombie, its pid reused, another boot). A marker of an older
    version (pid and host only): no such pid."""
    pid = doc.get("pid")
    if type(pid) is not int or pid <= 0 or not isinstance(doc.get("host"), str):
        return False  # unreadable: leave it
    if "pidns" in doc:
        return owner_gone(doc)
    if doc["host"] != socket.gethostname() or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _empty(folder: Path) -> bool:
    """Whether ``folder`` holds nothing, or only an empty marker (a ``kill -9`` between the
    ``mkdir`` and the marker's write leaves that: nothing of anyone's is in it)."""
    try:
        names = os.listdir(folder)
        return not names or (
            names == [STAGING_MARKER] and os.lstat(folder / STAGING_MARKER).st_size == 0
        )
    except OSError:
        return False


def remove_marked(folder: str | os.PathLike) -> bool:
    """Remove ``folder`` (a real folder; a link is never followed) its contents first, its
    marker last, then itself, so that a removal cut short (a signal, ``kill -9``, an error)
    leaves a folder still marked, which the next run removes; SIGINT/SIGTERM are held until
    it is done. True when it is gone."""
    folder = Path(folder)
    with interrupt.deferred():
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return not os.path.lexists(folder)
        whole = True
        for entry in entries:
            if entry.name == STAGING_MARKER:
                continue
            crashpoint.reached("remove: entry")
            try:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            except FileNotFoundError:
                pass
            except OSError:
                whole = False
        if not whole:
            return False  # (what is left keeps its marker)
        crashpoint.reached("remove: marker")
        with contextlib.suppress(FileNotFoundError, OSError):
            os.unlink(folder / STAGING_MARKER)
        crashpoint.reached("remove: folder")
        with contextlib.suppress(OSError):
            folder.rmdir()
    return not os.path.lexists(folder)


def remove_stale(out: str | os.PathLike) -> list[Path]:
    """Remove ``out``'s staging folders (and replaced outputs) whose writer is gone (a killed
    run's); return them. Only :func:`owned` folders are candidates, and folders of that exact
    name that hold nothing (a run killed while making one); anything else next to ``out``
    stays, and so do backups (the user's way back). A marker a killed publish left inside
    ``out`` itself (:func:`publish`) goes too; and where a publish by two renames was killed
    between them (``out`` missing), the output it had moved aside is put back first."""
    out = Path(out)
    try:
        names = os.listdir(out.parent)
    except OSError:
        return []
    removed = []
    if not os.path.lexists(out):
        _put_back_replaced(out, names)
    for name in sorted(names):
        p = out.parent / name
        named = _named(name, out)
        if named is None or p.is_symlink() or not p.is_dir():
            continue
        if _empty(p) or (
            named[0] in STALE_KINDS and owned(p, out) and _writer_gone(_marker(p) or {})
        ):
            if remove_marked(p):
                removed.append(p)
                remove_unheld_lock(p)  # its killed writer's lock file, next to it
    stray = _marker(out) if out.is_dir() and not out.is_symlink() else None
    if stray is not None and stray.get("out") == out.name and _writer_gone(stray):
        with contextlib.suppress(OSError):
            os.unlink(out / STAGING_MARKER)
    elif out.is_dir() and not out.is_symlink() and _empty_marker(out):
        with contextlib.suppress(OSError):
            os.unlink(out / STAGING_MARKER)
    return removed


def _put_back_replaced(out: Path, names: list[str]) -> None:
    """``out`` missing, and the output it held moved aside by a publish killed between its two
    renames (where there is no exchange): put it back, as it was."""
    old = [
        out.parent / n
        for n in names
        if (_named(n, out) or ("",))[0] == "old" and owned(out.parent / n, out)
    ]
    if len(old) == 1 and _writer_gone(_marker(old[0]) or {}):
        with contextlib.suppress(OSError):
            os.rename(old[0], out)
            os.unlink(out / STAGING_MARKER)


def _empty_marker(folder: Path) -> bool:
    try:
        st = os.lstat(folder / STAGING_MARKER)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


def discard(staging: str | os.PathLike, out: str | os.PathLike) -> None:
    """Remove a staging folder this run created (only when it still is one of ours)."""
    if owned(staging, out):
        remove_marked(staging)
    _made.pop(Path(staging), None)


def discard_unfinished() -> None:
    """Remove every staging folder this process made that is still there and still its own
    (marked with its token and this process as the writer): what a signal between a folder's
    making and its caller's clean-up would leave. Run when a command ends, however it ends."""
    for path, out in list(_made.items()):
        doc = _marker(path) or {}
        if owned(path, out) and doc.get("pid") == os.getpid():
            remove_marked(path)
        if not os.path.lexists(path):
            _made.pop(path, None)


interrupt.at_end(discard_unfinished)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (``renameat2(RENAME_EXCHANGE)``); False where unsupported
    (and in tests that set :data:`~episodekit.core.crashpoint.NO_EXCHANGE_ENV`)."""
    if os.environ.get(crashpoint.NO_EXCHANGE_ENV):
        return False
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
    SIGINT/SIGTERM cannot cut the swap nor the removal of the replaced output
    (:func:`episodekit.core.interrupt.deferred`): one that arrives during them is raised once
    the new output is in place and the old one gone."""
    staging, out = Path(staging), Path(out)
    named = _named(staging.name, out)
    if named is None or named[0] != "partial":
        raise ValueError(f"{staging} is not a staging folder of {out}")
    token = named[1]
    with interrupt.deferred():  # a signal in the swap is raised once the new output is in
        _swap(staging, out, token, attempts)
        _made.pop(staging, None)
        _maybe_die_after_swap(out)
        for p in (staging, staging_path(out, "old", token)):
            if p.is_dir() and not p.is_symlink():  # the replaced output, ours by its marker
                remove_marked(p)


def _swap(staging: Path, out: Path, token: str, attempts: int) -> None:
    """Put ``staging`` at ``out``; what ``out`` held moves to a marked name of ``token``. Runs
    as one deferred section: between two renames ``out`` does not exist, and a signal must not
    leave it so."""
    try:
        for _ in range(attempts):
            if out.is_dir() and not out.is_symlink():
                # the replaced output takes a marked name: a kill before it is deleted leaves
                # a folder the next run recognizes as ours (and a kill before the swap, a
                # marker in ``out`` that the next run removes: remove_stale)
                crashpoint.reached("publish: mark the replaced output")
                _write_marker(out, out, token)
                crashpoint.reached("publish: exchange")
                if _exchange(staging, out):
                    break
                old = staging_path(out, "old", token)
                if old.is_dir():  # replaced in an earlier attempt of this call
                    remove_marked(old)
                crashpoint.reached("publish: move the replaced output aside")
                with contextlib.suppress(FileNotFoundError):
                    os.rename(out, old)
            crashpoint.reached("publish: rename")
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
    crashpoint.reached("publish: unmark the new output")
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
