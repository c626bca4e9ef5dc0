"""Helpers shared by the CLI modules: one error policy, root checks, --debug/--quiet/--json,
progress, and the options several commands share (one definition, one meaning everywhere).

Exit codes, one meaning each (core/errors.py, docs/exit-codes.md): 0 success; 1 the data or a
check failed; 2 usage or environment (bad option value, missing root or not a dataset, an output
folder holding other files, unreachable hub, missing optional dependency, disk full, permission);
130 interrupted (SIGINT), 143 terminated (SIGTERM; both unwind the same way). An expected
failure prints one line on stderr, never a traceback; ``--debug`` (or ``EPISODEKIT_DEBUG=1``)
lets the traceback through.

Commands get all of this by being added to an :class:`EpisodekitGroup` (the root command and the
``prep``/``metadata`` groups are ones): it adds a hidden ``--debug`` to every command, installs
the progress reporter (cli/progress.py) and maps exceptions to exit codes.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from episodekit.cli.meta import DEBUG_ENV, META_DEBUG, META_JSON, META_QUIET, META_ROOT
from episodekit.cli.progress import CliProgress
from episodekit.core import interrupt
from episodekit.core.errors import EXIT_DATA, EXIT_ENV, DatasetError, EnvironmentProblem, Infeasible
from episodekit.core.executor import EXECUTORS, RAY_ADDRESS_ENV
from episodekit.core.paths import COST_MODELS, DEFAULT_TARGET_MB, MAX_TARGET_MB
from episodekit.core.progress import reporting

# OSError numbers that mean "the environment", not the data.
ENV_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EMFILE}
# Exception class names that mean "could not reach a server" (httpx, requests, urllib3, hub).
NETWORK_ERRORS = {
    "ConnectError",
    "ConnectTimeout",
    "ReadTimeout",
    "Timeout",
    "TimeoutException",
    "NetworkError",
    "ProxyError",
    "MaxRetryError",
    "NewConnectionError",
    "OfflineModeIsEnabled",
    "LocalEntryNotFoundError",
}
HUB_MISSING = {"RepositoryNotFoundError", "RevisionNotFoundError", "GatedRepoError"}
# Errors raised while decoding data files: the data is at fault (exit 1).
DATA_LIBRARIES = ("pyarrow", "duckdb", "polars")


# click >= 8.2 raises this for a group run without a command (it prints the group's help).
NO_ARGS_IS_HELP: type[Exception] | tuple = getattr(click.exceptions, "NoArgsIsHelpError", ())


class RootProblem(click.ClickException):
    """ROOT is not a dataset folder (missing, a file, empty): exit 2, one line."""

    exit_code = EXIT_ENV


def debug_enabled(ctx: click.Context | None = None) -> bool:
    """``--debug`` on the command line or ``EPISODEKIT_DEBUG=1`` in the environment."""
    if os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    ctx = ctx or click.get_current_context(silent=True)
    return bool(ctx and ctx.meta.get(META_DEBUG))


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes/contexts, outermost first (no cycles)."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _stdout_closed() -> bool:
    """True when our stdout's reader went away (EPIPE on a flush); stdout then goes to devnull,
    so the flush at interpreter exit does not fail again."""
    import select  # noqa: PLC0415

    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        closed = any(ev & select.POLLERR for _, ev in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False
    if closed:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    return closed


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def classify(exc: BaseException, root: str | None = None) -> tuple[int, str] | None:
    """``(exit code, one-line message)`` for an expected failure; None for a real bug."""
    chain = _chain(exc)
    names = {type(e).__name__ for e in chain}
    where = f"{root}: " if root else ""
    if isinstance(exc, EnvironmentProblem):
        return EXIT_ENV, _one_line(exc)
    if isinstance(exc, DatasetError):
        return EXIT_DATA, _one_line(exc)
    for e in chain:
        if isinstance(e, (ConnectionError, TimeoutError)) or type(e).__name__ in NETWORK_ERRORS:
            endpoint = os.environ.get("HF_ENDPOINT", "")
            via = f" (HF_ENDPOINT={endpoint})" if endpoint and root and "hf://" in root else ""
            return EXIT_ENV, _one_line(f"{where}cannot reach the server{via}: {e}")
    if names & HUB_MISSING:
        return EXIT_ENV, _one_line(f"{where}no such dataset repository or revision on the hub")
    if isinstance(exc, ModuleNotFoundError):
        extra = {"torch": "torch", "ray": "ray"}.get((exc.name or "").split(".")[0])
        fix = f": pip install 'episodekit[{extra}]'" if extra else ""
        return EXIT_ENV, _one_line(f"missing optional dependency {exc.name}{fix}")
    if isinstance(exc, OSError) and exc.errno in ENV_ERRNOS:
        return EXIT_ENV, _one_line(exc)
    if type(exc).__module__.split(".")[0] in DATA_LIBRARIES:
        return EXIT_DATA, _one_line(f"{where}unreadable data: {exc}")
    if isinstance(exc, FileNotFoundError):
        return EXIT_DATA, _one_line(exc)
    if type(exc) is ValueError or isinstance(exc, Infeasible):  # bad argument (DatasetError: data)
        return EXIT_ENV, _one_line(exc)
    return None


def _set_meta(key: str):
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value:
            ctx.meta[key] = value
        return value

    return callback


debug_option = click.option(
    "--debug",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_set_meta(META_DEBUG),
    help="Show the full traceback of a failure (also: EPISODEKIT_DEBUG=1).",
)


class EpisodekitGroup(click.Group):
    """A command group whose commands share the error policy, --debug and progress."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not isinstance(cmd, click.Group) and not any(p.name == "debug" for p in cmd.params):
            cmd.params.append(
                click.Option(
                    ["--debug"],
                    is_flag=True,
                    expose_value=False,
                    is_eager=True,
                    callback=_set_meta(META_DEBUG),
                    help="Show the full traceback of a failure (also: EPISODEKIT_DEBUG=1).",
                )
            )
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.parent is not None:  # only the root command wraps (once)
            return super().invoke(ctx)
        try:
            with reporting(CliProgress(ctx.meta)):
                return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            interrupt.check()  # an interrupt a library turned into an exception: still 130/143
            if isinstance(exc, BrokenPipeError) and _stdout_closed():
                raise SystemExit(EXIT_ENV) from None  # `| head` stopped reading: no hub problem
            if debug_enabled(ctx):
                raise
            root = ctx.meta.get(META_ROOT)
            known = classify(exc, root)
            if known is None:
                code, msg = (
                    EXIT_DATA,
                    (
                        f"unexpected {type(exc).__name__}: {_one_line(exc)} "
                        "(rerun with --debug for the traceback, and please report it)"
                    ),
                )
            else:
                code, msg = known
            err = click.ClickException(msg)
            err.exit_code = code
            raise err from exc

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """Usage errors in one line: ``Error: ... (see 'episodekit CMD --help')``; SIGINT and
        SIGTERM end any run with 128 + signal (:mod:`episodekit.core.interrupt`)."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        code = interrupt.run_command(lambda: self._exit_code(*args, **kwargs))
        if code > 128:  # also where a library swallowed the KeyboardInterrupt and the run went on
            click.echo(interrupt.message(code - 128), err=True)
        raise SystemExit(code)

    def _exit_code(self, *args: Any, **kwargs: Any) -> int | None:
        """Run the command; its exit code, None when it was interrupted."""
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except NO_ARGS_IS_HELP as exc:  # a bare group: its help, as click prints it
            exc.show()
            return exc.exit_code
        except click.UsageError as exc:
            path = " ".join(["episodekit", *_sub_path(exc.ctx)])
            click.echo(f"Error: {_one_line(exc.format_message())} (see '{path} --help')", err=True)
            return exc.exit_code
        except click.ClickException as exc:
            exc.show()
            return exc.exit_code
        except click.Abort:  # Ctrl-C or SIGTERM (click turns KeyboardInterrupt into Abort)
            return None
        except SystemExit as exc:  # a command's own code: sys.exit(report.exit_code())
            rv = exc.code
        return rv if isinstance(rv, int) else 0


def _sub_path(ctx: click.Context | None) -> list[str]:
    """The sub-command names of ``ctx`` (whatever the program was called)."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return names[::-1]


def check_root(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """ROOT must be a dataset folder: a clear exit 2 for a missing path, a file, a folder
    without meta/info.json; for a URL (hf://, memory://), an unreachable server too."""
    if value is None:
        return value
    ctx.meta[META_ROOT] = str(value)
    local = value[len("file://") :] if value.startswith("file://") else value
    if "://" in local:
        _check_remote_root(value)
        return value
    path = Path(local)
    if not path.exists():
        raise RootProblem(f"{value}: no such folder")
    if not path.is_dir():
        raise RootProblem(f"{value}: is a file; ROOT is a dataset folder (the one holding meta/)")
    if not (path / "meta" / "info.json").exists():  # unreadable: the command says why (exit 1)
        raise RootProblem(
            f"{value}: not a LeRobot dataset (no meta/info.json)" + _mixture_hint(ctx, path)
        )
    return value


def _mixture_hint(ctx: click.Context, folder: Path) -> str:
    """For a mixture plan folder given as ROOT: how to run the command on the mixture (with the
    options this command has), or on its sources."""
    from episodekit.metadata.mixture.spec import MIXTURE_FILE  # noqa: PLC0415

    spec = folder / MIXTURE_FILE
    if not spec.is_file():
        return ""
    options = {p.name for p in ctx.command.params}
    if "mixture" in options and "out" in options:
        return f"; it is a mixture plan folder: use --mixture {spec} --out {folder}"
    if "mixture" in options:
        return f"; it is a mixture plan folder: use --mixture {spec}"
    return (
        f"; it is a mixture plan folder: run this on each source root (listed by "
        f"'episodekit info --mixture {spec}')"
    )


def _check_remote_root(url: str) -> None:
    """One request for ``meta/info.json``: an unreachable server or a missing dataset is one
    line (exit 2) before any work starts. (``fs.exists`` would hide the network error.)"""
    import fsspec  # noqa: PLC0415 - only for remote roots

    try:
        fs, path = fsspec.core.url_to_fs(url)
        fs.info(f"{path.rstrip('/')}/meta/info.json")
    except FileNotFoundError:
        raise RootProblem(f"{url}: not a LeRobot dataset (no meta/info.json)") from None
    except Exception as exc:
        known = classify(exc, url)
        if known is None or debug_enabled():
            raise
        err = RootProblem(known[1])
        err.exit_code = EXIT_ENV
        raise err from None


def root_argument(required: bool = True):
    """The ROOT argument of commands that read a dataset (checked before anything runs)."""
    return click.argument("root", required=required, callback=check_root)


class IntList(click.ParamType):
    """'8,16,64' -> [8, 16, 64]; every value >= ``minimum`` (a usage error, exit 2, otherwise)."""

    name = "N[,N...]"

    def __init__(self, minimum: int = 1):
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        if isinstance(value, list):
            return value
        try:
            out = [int(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(f"expected comma-separated integers, got {value!r}", param, ctx)
        if not out:
            self.fail("expected at least one integer", param, ctx)
        low = [v for v in out if v < self.minimum]
        if low:
            self.fail(f"{low[0]} is not in the range x>={self.minimum}", param, ctx)
        return out


@contextlib.contextmanager
def writing(root: str, no_wait: bool) -> Iterator[None]:
    """Hold the writer lock of a local, existing ROOT for the command (a remote or missing root:
    no lock; the command itself reports what is wrong). A read-only ROOT is refused first
    (exit 2, one line): a writing command never reports success without writing."""
    from episodekit.core.lock import writer_lock  # noqa: PLC0415

    if "://" in str(root) or not os.path.isdir(root):
        yield
        return
    check_writable(root)
    with writer_lock(root, wait=not no_wait, say=lambda m: click.echo(m, err=True)):
        yield


def check_writable(root: str) -> None:
    """A local ROOT whose meta/ (or itself, without one) this process cannot write: one
    :class:`EnvironmentProblem` naming it (read-only mount, permissions)."""
    meta = os.path.join(root, "meta")
    target = meta if os.path.isdir(meta) else root
    if not os.access(target, os.W_OK):
        raise EnvironmentProblem("not writable (read-only, or no permission)", target)


# -- options shared by several commands (one definition, one meaning everywhere) ----------------

json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    callback=_set_meta(META_JSON),
    help="Print machine-readable JSON instead of a table (no progress on stderr).",
)
no_wait_option = click.option(
    "--no-wait",
    is_flag=True,
    help="Exit 2 at once when another episodekit process is writing to the same folder "
    "(ROOT, --out, or with --mixture a local source root; default: wait for it).",
)
force_option = click.option("--force", is_flag=True, help="Recompute even when fresh.")
quiet_option = click.option(
    "--quiet",
    "-q",
    is_flag=True,
    expose_value=False,
    callback=_set_meta(META_QUIET),
    help="No progress bars: one plain line per step (also the default when not a terminal).",
)


def _executor_available(ctx: click.Context, param: click.Parameter, value: str) -> str:
    import importlib.util  # noqa: PLC0415

    if value == "ray" and importlib.util.find_spec("ray") is None:
        raise click.BadParameter("ray is not installed: pip install 'episodekit[ray]'")
    return value


def _ray_address(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``--ray-address`` is read by the executor from the environment (as Ray itself does)."""
    if value:
        os.environ[RAY_ADDRESS_ENV] = value


def _executor(unit: str):
    return click.option(
        "--executor",
        type=click.Choice(EXECUTORS),
        callback=_executor_available,
        default="local",
        show_default=True,
        help=f"local: this machine (a process pool where {unit}s are processed in parallel); ray: "
        f"one Ray task per {unit} (same results either way; ray is an extra).",
    )


_ray_address_option = click.option(
    "--ray-address",
    metavar="ADDRESS",
    expose_value=False,
    callback=_ray_address,
    help="With --executor ray: the cluster to run on (ray://HEAD:10001 or HEAD:6379; default "
    "$RAY_ADDRESS, else the cluster `ray start` recorded on this machine, else a new local "
    "instance of this command's own).",
)


def executor_option(fn=None, *, unit: str = "file"):
    """``--executor`` and ``--ray-address`` (the latter sets ``$RAY_ADDRESS`` for the run); the
    help names the ``unit`` one Ray task processes (``@executor_option(unit="episode")``)."""
    if fn is None:
        return lambda f: _executor(unit)(_ray_address_option(f))
    return _executor(unit)(_ray_address_option(fn))


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


# a size in MB: > 0 and finite (inf or 1e300 would overflow the byte counts: exit 2, not a crash)
SIZE_MB = click.FloatRange(min=0, min_open=True, max=MAX_TARGET_MB)
target_mb_option = click.option(
    "--target-mb",
    type=SIZE_MB,
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


def exclude_options(func):
    """``--exclude-episodes``, ``--exclude-frames``, ``--exclude-flagged``, ``--flags-from``:
    frames the shard plans never draw (the data is not rewritten), passed to the command as one
    ``exclude`` argument (:class:`episodekit.exclusions.ExcludeOptions`)."""
    options = [
        click.option(
            "--exclude-episodes",
            metavar="LIST",
            default=None,
            help="Episodes the plans never draw, e.g. 3,7,10-12.",
        ),
        click.option(
            "--exclude-frames",
            metavar="FILE",
            type=click.Path(dir_okay=False, exists=True),
            default=None,
            help="JSON (or jsonl) file of frame ranges the plans never draw: "
            '[{"episode": 3, "start": 0, "end": 40}, ...], end exclusive.',
        ),
        click.option(
            "--exclude-flagged",
            metavar="CHECKS",
            default=None,
            help="Leave out the episodes these checks flag, e.g. quality.frozen,quality.duplicate "
            "(a fresh validation of just those checks, or the report given by --flags-from).",
        ),
        click.option(
            "--flags-from",
            metavar="REPORT",
            type=click.Path(dir_okay=False, exists=True),
            default=None,
            help="A `validate --json` report to read the flagged episodes from.",
        ),
    ]

    @functools.wraps(func)
    def wrapper(*args, exclude_episodes, exclude_frames, exclude_flagged, flags_from, **kwargs):
        from episodekit.exclusions import ExcludeOptions

        ex = ExcludeOptions(exclude_episodes, exclude_frames, exclude_flagged, flags_from)
        try:
            ex.check()
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        return func(*args, exclude=ex, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def split_long_option(no: str):
    """``--split-long no|yes|auto`` (prepare, metadata plan; default auto, a bare
    ``--split-long`` means yes): cut episodes into contiguous frame ranges. ``no`` says what
    happens to a world size whose bins whole episodes cannot fill."""
    return click.option(
        "--split-long",
        type=click.Choice(["no", "yes", "auto"]),
        default="auto",
        show_default=True,
        is_flag=False,
        flag_value="yes",
        help="Cut episodes into contiguous frame ranges: auto only for world sizes whose bins "
        f"cannot all get whole episodes (the summary says which), yes for every plan, no: {no}",
    )


PLAN_SPLIT = {"no": False, "yes": True, "auto": "auto"}  # --split-long -> PlanOptions.split_long
PLAN_LOCALITIES = ("none", "rowgroup")  # episodekit.metadata.plans.partition.LOCALITIES


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


def parse_canonical_bins(value: str | None) -> int | None | bool:
    """--canonical-bins: False when absent, None for auto, else a positive integer."""
    if value is None:
        return False
    if value.strip().lower() == "auto":
        return None
    try:
        c = int(value)
    except ValueError:
        c = 0
    if c < 1:
        raise click.BadParameter(
            f"{value!r} is not a positive integer or auto", param_hint="--canonical-bins"
        )
    return c


def canonical_bins_option():
    """--canonical-bins C|auto (metadata plan, prepare): also the world-size-free plan."""
    return click.option(
        "--canonical-bins",
        "canonical_bins",
        default=None,
        metavar="C|auto",
        help="Also write the canonical plan over C bins (any world size resumes from it; see "
        "elastic resume); auto: the default C for the episode count.",
    )
