"""The errors episodekit raises on purpose, and what each means for a command's exit code.

Light on purpose: the CLI imports these without pyarrow. One meaning per exit code (the table
is docs/exit-codes.md): 0 success; 1 the data is at fault: it failed a check, or a file of it
cannot be read as what it claims to be (:class:`DatasetError` and subclasses); 2 the command
cannot run as asked: usage, a path that does not exist or is the wrong kind, an output folder it
may not write, the environment (:class:`EnvironmentProblem`: disk full, read-only root,
permission, unreachable hub, missing optional dependency, another writer holding the lock);
130 interrupted (Ctrl-C, as shells expect: 128 + SIGINT); 143 terminated (SIGTERM: 128 + 15),
which unwinds exactly like Ctrl-C (:mod:`episodekit.core.interrupt`).
"""

from __future__ import annotations

import os
import re

EXIT_OK, EXIT_DATA, EXIT_ENV, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143


class DatasetError(Exception):
    """A dataset root that cannot be read as a LeRobot dataset; names the file at fault."""

    exit_code = EXIT_DATA

    def __init__(self, message: str, path: str | None = None):
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class MissingFileError(DatasetError):
    """A file the layout requires (info.json, tasks, episodes, a data file) does not exist."""


class UnsupportedVersionError(DatasetError):
    """``codebase_version`` is not one episodekit reads."""


class InconsistentDatasetError(DatasetError):
    """The metadata contradicts itself (ranges, lengths, totals)."""


class EnvironmentProblem(Exception):
    """The environment, not the data, stopped the work: disk full, read-only, permission, an
    unreachable hub, a missing optional dependency, a lock held by another writer. Names the file
    (or URL) and the operation."""

    exit_code = EXIT_ENV

    def __init__(self, message: str, path: str | None = None):
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class Infeasible(ValueError):  # noqa: N818 - a kind of bad argument, named for what it says
    """Options that ask for what the data cannot give (e.g. more plan bins than episodes or
    frames): a bad argument (exit 2), of its own type so that a caller that can ask otherwise
    (cut episodes) retries on exactly this, never on another ValueError (a bug)."""


# errno values that mean "the environment", not the data (exit 2).
_ENV_ERRNOS = {
    "ENOSPC",  # disk full
    "EDQUOT",  # quota
    "EROFS",  # read-only filesystem
    "EACCES",  # permission
    "EPERM",
    "EMFILE",  # too many open files
    "ENFILE",
    "EIO",  # the disk itself
    "ENOMEM",
    "EBUSY",
    "ETXTBSY",
}


def os_problem(exc: OSError, path: object, operation: str) -> DatasetError | EnvironmentProblem:
    """One clear error for an ``OSError`` met while doing ``operation`` ("write", "read",
    "replace", ...) on ``path``: an :class:`EnvironmentProblem` (exit 2) for disk full, read-only,
    permission and the like, else a :class:`DatasetError` (exit 1). The result keeps ``errno``."""
    import errno as _errno

    # pyarrow's OSErrors say "[errno 13]" in a message naming the temporary file: the plain
    # reason keeps the one line naming ``path`` once.
    code = exc.errno
    if code is None:
        found = re.search(r"\[errno (\d+)\]", str(exc))
        code = int(found.group(1)) if found else None
    name = _errno.errorcode.get(code or 0, "")
    plain = os.strerror(code) if code else ""
    reason = plain or exc.strerror or str(exc) or type(exc).__name__
    cls = EnvironmentProblem if name in _ENV_ERRNOS else DatasetError
    out = cls(f"cannot {operation}: {reason}", str(path))
    out.errno = code  # type: ignore[attr-defined]
    return out
