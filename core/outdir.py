"""The one rule for a folder a command may fill, replace or delete (``sample ROOT``, ``--out``,
a frame store): it must be missing, empty, or one episodekit wrote itself (it leaves
:data:`MARKER` there), unless the caller forces it; and never ``/``, ``$HOME``, the current
folder or a parent of it, forced or not. A refusal is an :class:`UnsafeOutputError` (exit 2,
one line) raised before anything is written, so a user's files stay intact.
"""

from __future__ import annotations

import os
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


def check_output_dir(
    path: str | os.PathLike, force: bool = False, own: tuple[str, ...] = (), option: str = ""
) -> Path:
    """Refuse (:class:`UnsafeOutputError`) to write into ``path`` unless it is missing, empty,
    holds :data:`MARKER` or one of ``own`` (names only episodekit writes there, e.g. a frame
    store's manifest), or ``force``. Protected folders are refused even with ``force``.
    ``option`` (e.g. "--force") is named in the refusal when the caller offers one."""
    p = resolve_output(path)
    why = _protected(p)
    if why:
        raise UnsafeOutputError(f"refusing to write here: {why}; give a new folder", str(path))
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
