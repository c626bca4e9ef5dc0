"""The errors a dataset root can raise (light: the CLI imports these without pyarrow)."""

from __future__ import annotations


class DatasetError(Exception):
    """A dataset root that cannot be read as a LeRobot dataset; names the file at fault."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class MissingFileError(DatasetError):
    """A file the layout requires (info.json, tasks, episodes, a data file) does not exist."""


class UnsupportedVersionError(DatasetError):
    """``codebase_version`` is not one episodekit reads."""


class InconsistentDatasetError(DatasetError):
    """The metadata contradicts itself (ranges, lengths, totals)."""
