"""Helpers shared by the CLI modules."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import click

from episodekit.core.dataset import DatasetError


@contextlib.contextmanager
def fail_cleanly() -> Iterator[None]:
    """Turn a bad dataset root or bad argument into a one-line error (exit 1), not a traceback."""
    try:
        yield
    except (DatasetError, ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc


def parse_int_list(value: str) -> list[int]:
    """'8,16,64' -> [8, 16, 64] with a clear error."""
    try:
        out = [int(v) for v in str(value).split(",") if v.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from exc
    if not out:
        raise click.BadParameter("expected at least one integer")
    return out
