"""What every artifact under ``meta/`` shares: where it is, reading it (size-bounded), writing it
atomically to a local root, and the kinds of problem a verification reports.

Speed percentiles, the cost table and shard plans each own their format; this module owns the
plumbing, so "root or Dataset", the local-write guard and the read limits are written once.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

from episodekit.core.atomic import atomic_write_bytes
from episodekit.core.dataset import Dataset, DatasetError, is_local, resolve_root
from episodekit.core.errors import os_problem
from episodekit.core.paths import inside_root

MAX_ARTIFACT_BYTES = 1 << 30  # no artifact of ours is near this; refuse before reading


class ArtifactError(DatasetError):
    """An artifact that cannot be read or written; the message names the file."""


def locate(root_or_ds: Dataset | str | os.PathLike | Any) -> tuple[Any, str, str]:
    """``(fs, root path, display name)`` of a Dataset or a root path/URL (nothing is opened)."""
    if isinstance(root_or_ds, Dataset):
        return root_or_ds.fs, root_or_ds.path, root_or_ds.root
    fs, path = resolve_root(
        os.fspath(root_or_ds) if isinstance(root_or_ds, os.PathLike) else root_or_ds
    )
    return fs, path, str(root_or_ds)


def artifact_path(root_or_ds: Dataset | str | os.PathLike, rel: str) -> str:
    """Full path (in the root's filesystem) of the artifact ``rel``."""
    _, path, _ = locate(root_or_ds)
    return posixpath.join(path, rel)


def read_bytes(
    root_or_ds: Dataset | str | os.PathLike, rel: str, max_bytes: int = MAX_ARTIFACT_BYTES
) -> bytes | None:
    """The artifact's bytes, or None when it is absent. A file larger than ``max_bytes`` is refused
    before it is read (artifacts come from hubs: untrusted input)."""
    fs, path, _ = locate(root_or_ds)
    full = posixpath.join(path, rel)
    try:
        size = fs.size(full)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_problem(exc, full, "read") from exc
    if size is not None and size > max_bytes:
        raise ArtifactError(f"{size} bytes is more than this artifact can be ({max_bytes})", full)
    try:
        with fs.open(full, "rb") as fh:
            return fh.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_problem(exc, full, "read") from exc


def local_target(root_or_ds: Dataset | str | os.PathLike, rel: str) -> str:
    """The local path to write ``rel`` to; a remote root raises :class:`ArtifactError`."""
    fs, path, name = locate(root_or_ds)
    if not is_local(fs):
        raise ArtifactError("artifacts can only be written to a local dataset root", name)
    return inside_root(path, rel)  # a symlinked meta/ may not lead the write out of the root


def write_bytes(root_or_ds: Dataset | str | os.PathLike, rel: str, data: bytes) -> str:
    """Write the artifact atomically (temp file + ``os.replace``) and return its path."""
    target = local_target(root_or_ds, rel)
    atomic_write_bytes(target, data)
    return target


FORMAT, FRESH, CONTENT = "format", "fresh", "content"


class Problem(str):
    """A verification problem: its message, and its ``kind`` (``format``: unreadable or of another
    version; ``fresh``: computed from other episodes; ``content``: wrong values). Validation maps
    the kind to its check id (``costs.fresh`` ...), so no check is decided by matching words."""

    kind: str

    def __new__(cls, message: str, kind: str = CONTENT) -> Problem:
        obj = super().__new__(cls, message)
        obj.kind = kind
        return obj
