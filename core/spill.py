"""Temporary spill folders of a pass, made so that a killed run's are removed by the next one.

The stats pass spills to local disk (sorted runs, per-episode stats, the sketches) in folders
made by :func:`spill_folder` under ``dir`` (``spill_dir``; default the system's temporary
folder, ``TMPDIR``). Each holds :data:`SPILL_MARKER`, a small JSON file naming its owner: pid,
the process's start time (``/proc/<pid>/stat``), the boot id, the pid namespace and the host.
The folder goes when its owner is done with it (the ``with`` block ends, on an error or Ctrl-C
too, or the object holding it is collected); a ``kill -9`` (or an OOM kill) leaves it behind,
so before making a folder :func:`remove_stale` lists the same parent and removes a sibling only
when ALL hold:

- its name starts with one of our :data:`PREFIXES`, and it is a real folder (not a link) of
  this user;
- it holds our marker (a regular file, valid JSON with the fields above) naming this host and
  this pid namespace (a container sharing the folder has pids of its own);
- its owner is provably gone: another boot, no such pid (or a zombie), or the pid now belongs to
  a process started at another time (reused).

Anything else stays: a look-alike ``episodekit-stats-x`` without our marker, a folder of a live
run (another process's, or this one's), another machine's or container's on a shared disk, a
folder we may not remove (a read-only parent: the run goes on without removing it). Never a
pattern: one listing, each entry checked by itself.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import tempfile
import weakref
from types import TracebackType

from episodekit.core.errors import EnvironmentProblem

log = logging.getLogger(__name__)

SPILL_MARKER = ".episodekit-spill"  # inside every spill folder: whose it is
PREFIXES = ("episodekit-stats-", "episodekit-sketches-", "episodekit-episode-stats-")
MARKER_MAX = 4096  # bytes of a marker read at most (ours are ~150)
BOOT_ID = "/proc/sys/kernel/random/boot_id"
OPTIONAL = ("start", "boot", "pidns")  # marker fields that may be null (no /proc)
# a marker is read without following a link (nor blocking on a FIFO planted under its name)
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of ``pid`` from ``/proc/<pid>/stat``, or
    None where there is no such file (no such process, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) ": comm may hold anything
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _boot_id() -> str | None:
    try:
        with open(BOOT_ID, encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _pid_namespace() -> str | None:
    """This process's pid namespace (``pid:[inode]``): pids mean something only inside it."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def owner_record(pid: int | None = None) -> dict:
    """The marker's content for process ``pid`` (default this one)."""
    pid = os.getpid() if pid is None else pid
    st = _proc_stat(pid)
    return {
        "pid": pid,
        "start": st[1] if st else None,
        "boot": _boot_id(),
        "pidns": _pid_namespace(),
        "host": socket.gethostname(),
    }


def owner_gone(doc: dict) -> bool:
    """Whether the process a marker names is provably gone (see the module docstring); False
    whenever it cannot be told (another host, no start time and the pid alive, ...)."""
    if doc.get("host") != socket.gethostname():
        return False
    if doc.get("pidns") != _pid_namespace():
        return False  # another container's pids (a shared /tmp): not ours to judge
    pid = doc["pid"]
    boot = _boot_id()
    if doc.get("boot") and boot and doc["boot"] != boot:
        return True  # the machine restarted since: every process of then is gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    except OSError:
        return False
    st = _proc_stat(pid)
    if st is None:
        return False  # no /proc: the pid is alive, whoever it is now
    state, start = st
    if state == "Z":
        return True  # killed, not yet reaped: owns nothing any more
    return doc.get("start") is not None and start != doc["start"]


def read_marker(folder: str) -> dict | None:
    """The owner record in ``folder``'s marker, or None unless it is a regular file (not a link)
    holding a JSON object with an int pid, a host and start/boot/pidns strings (or null)."""
    path = os.path.join(folder, SPILL_MARKER)
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        doc = json.loads(os.read(fd, MARKER_MAX))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(doc, dict) or not isinstance(doc.get("host"), str):
        return None
    pid = doc.get("pid")
    if type(pid) is not int or pid <= 0:
        return None
    if any(doc.get(k) is not None and not isinstance(doc[k], str) for k in OPTIONAL):
        return None
    return doc


def remove_stale(parent: str | os.PathLike) -> list[str]:
    """Remove the spill folders in ``parent`` whose owner is gone (a killed run's; see the
    module docstring); return the paths removed. Never raises for what it cannot list or remove."""
    parent = os.fspath(parent)
    removed = []
    try:
        entries = sorted(
            (e for e in os.scandir(parent) if e.name.startswith(PREFIXES)), key=lambda e: e.name
        )
    except OSError:
        return removed
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if uid is not None and entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        doc = read_marker(entry.path)
        if doc is None or not owner_gone(doc):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)  # a link inside is removed, not followed
        if not os.path.lexists(entry.path):
            removed.append(entry.path)
    if removed:
        log.info(
            "removed %d temporary folder(s) of killed runs in %s: %s",
            len(removed),
            parent,
            ", ".join(os.path.basename(p) for p in removed),
        )
    return removed


class SpillFolder:
    """A temporary folder with our marker (see the module docstring), removed by
    :meth:`cleanup`, at the end of a ``with`` block (which yields its path), or when the object
    is collected (an owner such as a returned result keeps it alive), like
    :class:`tempfile.TemporaryDirectory`."""

    def __init__(self, prefix: str, dir: str | os.PathLike | None = None) -> None:
        if prefix not in PREFIXES:
            raise ValueError(f"spill folder prefix must be one of {PREFIXES}, got {prefix!r}")
        parent = os.fspath(dir) if dir is not None else tempfile.gettempdir()
        remove_stale(parent)
        try:
            self.name = tempfile.mkdtemp(prefix=prefix, dir=parent)
        except OSError as exc:  # the environment's, never the data's: exit 2
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise EnvironmentProblem(f"cannot create a temporary folder: {reason}", parent) from exc
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.name, ignore_errors=True)
        try:
            with open(os.path.join(self.name, SPILL_MARKER), "x", encoding="utf-8") as fh:
                json.dump(owner_record(), fh)
        except BaseException:
            self._finalizer()
            raise

    def cleanup(self) -> None:
        """Remove the folder now (idempotent)."""
        self._finalizer()

    def __enter__(self) -> str:
        return self.name

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        return f"<SpillFolder {self.name!r}>"


def spill_folder(prefix: str, dir: str | os.PathLike | None = None) -> SpillFolder:
    """A new :class:`SpillFolder` named ``prefix`` + random under ``dir`` (default the system's
    temporary folder), after removing the killed runs' there. ``with spill_folder(p) as path:``
    removes it at the block's end; kept as an object, it goes with its last owner."""
    return SpillFolder(prefix, dir)
