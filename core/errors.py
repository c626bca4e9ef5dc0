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
