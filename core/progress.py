"""Progress of long steps: library code reports it, the front end (the CLI) decides how it looks.

Library functions never print. They call :func:`current` and report steps (one line each) and
counted tasks (files, with bytes when known). The default reporter does nothing, so a training
script or a test sees no output; the CLI installs a terminal reporter (tqdm bars, or plain lines
when stderr is not a terminal) with :func:`reporting`. The per-file executor
(:mod:`episodekit.core.executor`) opens a task by itself, so every per-file job (row-group
rewrite, validation scans, frame-store builds) gets a bar without passing anything around.

Light on purpose: no third-party import here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar


class Task:
    """A counted piece of work (``total`` items); the silent default does nothing."""

    def advance(self, n: int = 1, nbytes: int = 0) -> None:
        """``n`` more items done, ``nbytes`` more bytes processed."""

    def close(self) -> None:
        """The work is over (also on errors)."""

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Progress:
    """What library code reports to. This base class is silent."""

    def step(self, message: str) -> None:
        """One line about a step (a plain stream shows exactly these lines)."""

    def stage(self, name: str) -> None:
        """Name the work that follows (the label of the bars opened next); prints nothing."""

    def task(self, total: int | None, label: str | None = None, unit: str = "file") -> Task:
        """Open a counted task (``total`` None: unknown); close it (or use it as a context
        manager) when done. ``label`` defaults to the current stage's name."""
        return Task()

    def active(self) -> Task:
        """The innermost open task (a silent one when none is open): lets a caller add bytes
        to a bar the executor opened."""
        return Task()


_SILENT = Progress()
_current: ContextVar[Progress | None] = ContextVar("episodekit_progress", default=None)


def current() -> Progress:
    """The reporter in effect (silent unless a front end installed one)."""
    return _current.get() or _SILENT


@contextlib.contextmanager
def reporting(progress: Progress) -> Iterator[Progress]:
    """Install ``progress`` for the code run inside the ``with`` block."""
    token = _current.set(progress)
    try:
        yield progress
    finally:
        _current.reset(token)
