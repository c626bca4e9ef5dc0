"""The errors episodekit raises on purpose, and what each means for a command's exit code.

Light on purpose: the CLI imports these without pyarrow. One meaning per exit code:
0 success; 1 the data or a check failed (:class:`DatasetError` and subclasses); 2 usage or
environment (:class:`EnvironmentProblem`: disk full, read-only root, permission, unreachable
hub, missing optional dependency, another writer holding the root's lock; and bad options).
"""

from __future__ import annotations

EXIT_OK, EXIT_DATA, EXIT_ENV = 0, 1, 2


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

    name = _errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or str(exc) or type(exc).__name__
    cls = EnvironmentProblem if name in _ENV_ERRNOS else DatasetError
    out = cls(f"cannot {operation}: {reason}", str(path))
    out.errno = exc.errno  # type: ignore[attr-defined]
    return out
