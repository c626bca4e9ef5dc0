"""The errors of mixtures: a spec or plan that cannot be used, and the two that are the
user's paths or the environment rather than the data (exit 2)."""

from __future__ import annotations

from episodekit.core.dataset import DatasetError
from episodekit.core.errors import EXIT_ENV, EnvironmentProblem


class MixtureError(DatasetError):
    """A mixture spec or mixture plan that cannot be used; one line naming the field."""


class MixtureFileError(MixtureError, EnvironmentProblem):
    """The --mixture file is missing or unreadable: a bad option or the environment, like a
    missing ROOT (exit 2), not a data problem."""

    exit_code = EXIT_ENV


class MixtureSourceMissing(MixtureError, EnvironmentProblem):
    """A local source root that is missing, a file or not a dataset: a path the user must fix,
    like a missing ROOT (exit 2), not a data problem."""

    exit_code = EXIT_ENV
