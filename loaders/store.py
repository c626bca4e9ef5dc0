"""Reading a frame store (built by ``episodekit prep frames``): memory-mapped, read-only.

Each column is ``np.load(path, mmap_mode="r")``: pages come from the page cache, so every rank
and DataLoader worker of a node shares one copy, and a process's anonymous memory stays small
(file-backed pages are counted apart, as ``RssFile``). Pickling a :class:`FrameStore` (spawned
workers) sends its path and manifest only; the child maps the same files again.

:func:`find_store` decides which store a :class:`~episodekit.loaders.FrameDataset` uses:
``"auto"`` takes the dataset's default store when one is published and fresh (and warns once
when it is stale), ``None`` none, a path that store (an error when missing or stale).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset
from episodekit.core.store import (
    StaleStoreError,
    StoreError,
    StoreNotFoundError,
    default_store_dir,
    open_columns,
    read_manifest,
    stale_reasons,
)

AUTO = "auto"
_warned: set[tuple[str, str]] = set()


def warn_once(key: str, kind: str, message: str) -> None:
    """A ``UserWarning`` the first time (per process) for this (key, kind)."""
    if (key, kind) in _warned:
        return
    _warned.add((key, kind))
    warnings.warn(message, UserWarning, stacklevel=3)


def frames_command(ds: Dataset) -> str:
    """The command that builds the store of ``ds`` (named in warnings and errors)."""
    return f"episodekit prep frames {ds.root}"


class FrameStore:
    """A published frame store, memory-mapped. ``columns[name]`` is an ``(frames, *shape)``
    array indexed by ``global frame index - base``."""

    def __init__(self, path: str | os.PathLike, manifest: dict[str, Any] | None = None):
        self.path = Path(path)
        self.manifest = manifest if manifest is not None else read_manifest(self.path)
        self.base = int(self.manifest["base"])
        self.num_frames = int(self.manifest["num_frames"])
        # plain ndarray views of the maps: no np.memmap overhead per index
        self.columns = {k: np.asarray(a) for k, a in open_columns(self.path, self.manifest).items()}
        self._views: dict[tuple[str, int], np.ndarray] = {}

    def stale_reasons(self, ds: Dataset) -> list[str]:
        """Why this store does not match ``ds`` now (empty: fresh). Reads each data file's
        footer once (the same bytes the parquet reader needs anyway)."""
        return stale_reasons(self.manifest, ds)

    def window_view(self, name: str, width: int) -> np.ndarray:
        """Read-only sliding-window view ``(frames - width + 1, width, *shape)`` of a column:
        ``view[p]`` is rows ``p .. p + width - 1`` (no copy until indexed)."""
        view = self._views.get((name, width))
        if view is None:
            a = self.columns[name]
            view = np.lib.stride_tricks.as_strided(
                a,
                shape=(len(a) - width + 1, width, *a.shape[1:]),
                strides=(a.strides[0], *a.strides),
                writeable=False,
            )
            self._views[(name, width)] = view
        return view

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.columns.values())

    def __repr__(self) -> str:
        cols = list(self.columns)
        return f"FrameStore({str(self.path)!r}, frames={self.num_frames}, columns={cols})"

    def __getstate__(self) -> dict[str, Any]:
        return {"path": str(self.path), "manifest": self.manifest}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["manifest"])


def find_store(ds: Dataset, store: str | os.PathLike | None = AUTO) -> FrameStore | None:
    """The fresh store to read ``ds`` through, or None (then read parquet).

    ``"auto"``: the dataset's default store (``$EPISODEKIT_CACHE`` or ``~/.cache/episodekit``)
    when it exists and is fresh; a stale or broken one is ignored with one warning naming the
    command that rebuilds it. ``None``: no store. A path: that store, or
    :class:`StoreNotFoundError` / :class:`StaleStoreError`.
    """
    if store is None:
        return None
    if isinstance(store, str) and store == AUTO:
        path = default_store_dir(ds)
        try:
            fs = FrameStore(path)
            reasons = fs.stale_reasons(ds)
        except StoreNotFoundError:
            return None
        except (StoreError, OSError) as exc:
            reasons = [str(exc)]
        if reasons:
            warn_once(
                str(ds.root),
                "stale",
                f"frame store {path} is stale ({'; '.join(reasons)}): reading parquet instead; "
                f"rebuild it with `{frames_command(ds)}`",
            )
            return None
        return fs
    fs = FrameStore(store)
    reasons = fs.stale_reasons(ds)
    if reasons:
        raise StaleStoreError(
            f"frame store does not match {ds.root} ({'; '.join(reasons)}); rebuild it with "
            f"`{frames_command(ds)} --store {store}`",
            str(store),
        )
    return fs
