"""The one rule for a folder a command may fill, replace or delete (``sample ROOT``, every
``--out``, mixture plan folders included, a frame store): it must be missing, empty, or one
episodekit wrote itself (it leaves :data:`MARKER` there), unless the caller forces it; never
``/``, ``$HOME``, the current folder or a parent of it, forced or not; and never a dataset the
command reads (``sources``), a folder inside one or a folder holding one. A refusal is an
:class:`UnsafeOutputError` (exit 2, one line) raised before anything is written, so a user's
files stay intact.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from episodekit.core.atomic import atomic_write_text
from episodekit.core.errors import EnvironmentProblem

MARKER = ".episodekit-output"  # left in every folder episodekit created and may replace
IGNORED = {".episodekit.lock", MARKER}  # a folder holding only these is episodekit's


class UnsafeOutputError(EnvironmentProblem):
    """The output folder holds someone else's files, or is one no command may replace."""


def _protected(real: Path) -> str | None:
    """Why ``real`` (resolved) may never be an output folder, or None."""
    cwd = Path.cwd().resolve()
    if real == Path(real.anchor):
        return "it is the filesystem root"
    if real == Path.home().resolve():
        return "it is your home folder"
    if real == cwd:
        return "it is the current folder"
    if real in cwd.parents:
        return "it holds the current folder"
    return None


def _local(source: str | os.PathLike) -> Path | None:
    """A source root as a resolved local path; None for a remote one (hf://, s3://...)."""
    text = os.fspath(source)
    text = text[len("file://") :] if text.startswith("file://") else text
    return None if "://" in text else Path(text).expanduser().resolve()


def _around_source(real: Path, sources: Iterable[str | os.PathLike]) -> str | None:
    """Why ``real`` (resolved) may not be the output of a command reading ``sources``, or None
    (the output's path is named once, in front of the message: not repeated here)."""
    for source in sources:
        src = _local(source)
        if src is None:
            continue
        if real == src:
            return "it is the source dataset"
        if src in real.parents:
            return "it is inside the source dataset"
        if real in src.parents:
            return f"it holds the source dataset {src.relative_to(real)}"
    return None


def check_output_dir(
    path: str | os.PathLike,
    force: bool = False,
    own: tuple[str, ...] = (),
    option: str = "",
    sources: Iterable[str | os.PathLike] = (),
) -> Path:
    """Refuse (:class:`UnsafeOutputError`) to write into ``path`` unless it is missing, empty,
    holds :data:`MARKER` or one of ``own`` (names only episodekit writes there, e.g. a frame
    store's manifest), or ``force``. Protected folders, and a folder that is, lies inside or
    holds one of ``sources`` (the local dataset roots the command reads; remote ones are
    skipped), are refused even with ``force``. ``option`` (e.g. "--force") is named in the
    refusal when the caller offers one."""
    p = resolve_output(path)
    why = _protected(p)
    if why:
        raise UnsafeOutputError(f"refusing to write here: {why}; give a new folder", str(path))
    why = _around_source(p, sources)
    if why:
        raise UnsafeOutputError(
            f"refusing to write here: {why}; give a folder outside it", str(path)
        )
    if not p.exists():
        return p
    if not p.is_dir():
        raise UnsafeOutputError("is a file; give a folder", str(path))
    listing = set(os.listdir(p))
    names = listing - IGNORED
    if force or not names or MARKER in listing or names & set(own):
        return p
    fix = f" (or pass {option} to replace it)" if option else ""
    raise UnsafeOutputError(
        f"not empty and not written by episodekit (it holds {sorted(names)[0]!r}); "
        f"give a new or empty folder{fix}",
        str(path),
    )


def resolve_output(path: str | os.PathLike) -> Path:
    """The real path a command writes for ``path`` (symlinks resolved), checked before anything
    is created: a dangling symlink anywhere on the way is refused (:class:`UnsafeOutputError`)
    rather than followed, so no folder chain is made where the link points."""
    p = Path(path).expanduser().absolute()
    for q in (p, *p.parents):
        if q.is_symlink() and not q.exists():
            raise UnsafeOutputError(
                f"{q} is a symlink to {os.readlink(q)!r}, which does not exist; "
                "give an existing folder or a new path",
                str(path),
            )
    return Path(os.path.realpath(p))


def mark_output_dir(path: str | os.PathLike, what: str) -> None:
    """Leave :data:`MARKER` in ``path`` (created if missing): episodekit may replace it later."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    if not (p / MARKER).exists():
        text = f"written by episodekit ({what}); episodekit may replace this folder\n"
        atomic_write_text(p / MARKER, text)
