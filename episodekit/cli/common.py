"""Helpers shared by the CLI modules."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import click

from episodekit.core.errors import EXIT_ENV, DatasetError, EnvironmentProblem
from episodekit.core.executor import EXECUTORS
from episodekit.core.paths import COST_MODELS, DEFAULT_TARGET_MB


@contextlib.contextmanager
def fail_cleanly() -> Iterator[None]:
    """Turn a bad dataset root or bad argument into a one-line error (exit 1), and an environment
    problem (missing optional dependency, read-only root, ...) into one (exit 2); no traceback."""
    try:
        yield
    except EnvironmentProblem as exc:
        error = click.ClickException(str(exc))
        error.exit_code = EXIT_ENV
        raise error from exc
    except (DatasetError, ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc


@contextlib.contextmanager
def writing(root: str, no_wait: bool) -> Iterator[None]:
    """Hold the writer lock of a local, existing ROOT for the command (a remote or missing root:
    no lock; the command itself reports what is wrong)."""
    import os

    from episodekit.core.lock import writer_lock

    if "://" in str(root) or not os.path.isdir(root):
        yield
        return
    with writer_lock(root, wait=not no_wait, say=lambda m: click.echo(m, err=True)):
        yield


def parse_int_list(value: str) -> list[int]:
    """'8,16,64' -> [8, 16, 64] with a clear error."""
    try:
        out = [int(v) for v in str(value).split(",") if v.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from exc
    if not out:
        raise click.BadParameter("expected at least one integer")
    return out


# -- options shared by several commands (one definition, one meaning everywhere) ----------------

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of a table."
)
no_wait_option = click.option(
    "--no-wait",
    is_flag=True,
    help="Exit 2 at once when another episodekit process is writing to the same root "
    "(default: wait for it).",
)
force_option = click.option("--force", is_flag=True, help="Recompute even when fresh.")
quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress output.")
executor_option = click.option(
    "--executor",
    type=click.Choice(EXECUTORS),
    default="local",
    show_default=True,
    help="local process pool, or Ray tasks (same results either way; ray is an extra).",
)


def cost_option(name: str = "--cost"):
    """The cost model option (``--cost`` on plan/prepare, ``--model`` on costs)."""
    return click.option(
        name,
        type=click.Choice(list(COST_MODELS)),
        default="frames",
        show_default=True,
        help="frames: length; compute: length x action_dim x cameras; bytes: data + video bytes; "
        "decode: measured video decode seconds (PyAV).",
    )


target_mb_option = click.option(
    "--target-mb",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TARGET_MB,
    show_default=True,
    help="Row-group size target in MiB of uncompressed data (accepted band: half to 1.5x).",
)
jobs_option = click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    help="Processes for per-file work (default: number of cores).",
)


def dataloader_workers_option(default: int = 1):
    """``--workers``: DataLoader workers per rank (never processes: that is ``--jobs``)."""
    return click.option(
        "--workers",
        type=click.IntRange(min=1),
        default=default,
        show_default=True,
        help="DataLoader workers per rank the shard plans are made for.",
    )


PLAN_LOCALITIES = ("none", "rowgroup")  # episodekit.metadata.partition.LOCALITIES


def locality_option(default: str):
    """``--locality``: how shard plans group episodes (rowgroup: contiguous row-group runs)."""
    return click.option(
        "--locality",
        type=click.Choice(list(PLAN_LOCALITIES)),
        default=default,
        show_default=True,
        help="none: balance episodes anywhere (LPT/KK; a worker reads every row group); "
        "rowgroup: each bin is a contiguous run of row groups in file order, balanced by cost "
        "(a worker reads ~1/bins of the data).",
    )


def deprecated_alias(old: str, new: str, dest: str, is_flag: bool = False, **kwargs):
    """A hidden option ``old`` that still works for one release, with a deprecation message
    naming ``new``; its value lands in ``dest`` (merge it with :func:`pick`)."""

    def warn(ctx: click.Context, param: click.Parameter, value):
        if value not in (None, False):
            click.echo(f"warning: {old} is deprecated, use {new}", err=True)
        return value

    return click.option(old, dest, is_flag=is_flag, hidden=True, callback=warn, **kwargs)


def pick(value, deprecated):
    """The new option's value, else the deprecated alias's."""
    return deprecated if value in (None, False) and deprecated not in (None, False) else value
