"""Spilled sorted runs: one scan job's blocks' sorted columns on local disk (run-length encoded
where values repeat, a fence of every :data:`FENCE`-th value in memory), read back with
``pread``."""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from episodekit.core.dataset import DatasetError

FENCE = 512  # every FENCE-th value of a spilled run stays in memory: its searches read one window


class Run(NamedTuple):
    """One spilled sorted column of one block: ``length`` values of ``dtype`` at ``offset`` of
    ``path``; run-length encoded when ``counts_offset >= 0`` (distinct values, then their int64
    counts there), else raw with ``fence`` (``values[::FENCE]``)."""

    path: str
    dim: int
    dtype: str
    offset: int
    length: int
    counts_offset: int
    fence: np.ndarray | None


class Spill:
    """One scan job's spill file: every block's sorted columns, one record per dimension,
    appended with large sequential writes. A column with many repeats (integer ids, timestamps)
    is stored run-length encoded (distinct values + counts), the rest as raw values."""

    def __init__(self, path: str):
        self.path = path
        self.fh = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.offset = 0

    def _write(self, arr: np.ndarray) -> int:
        """Append ``arr``; returns its offset."""
        at = self.offset
        self.fh.write(np.ascontiguousarray(arr).data)
        self.offset += arr.nbytes
        return at

    def add(self, sorted_cols: np.ndarray) -> list[Run]:
        """The records of one block's sorted columns ``(D, rows)``."""
        out = []
        rows = sorted_cols.shape[1]
        for j, col in enumerate(sorted_cols):
            distinct = int(np.count_nonzero(col[1:] != col[:-1])) + 1
            dt = col.dtype.str
            if distinct * (col.itemsize + 8) * 2 <= col.nbytes:
                first = np.r_[0, np.flatnonzero(col[1:] != col[:-1]) + 1]
                counts = np.diff(np.r_[first, rows]).astype(np.int64)
                at = self._write(col[first])
                out.append(Run(self.path, j, dt, at, len(first), self._write(counts), None))
            else:
                fence = col[::FENCE].copy()
                out.append(Run(self.path, j, dt, self._write(col), rows, -1, fence))
        return out

    def close(self) -> None:
        self.fh.close()


class RunReader:
    """Reads slices of spilled runs with ``pread`` (no memory map: a mapped page-cache file
    counts fully towards RSS once the kernel maps its large folios)."""

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}

    def read(self, run: Run, start: int, stop: int, counts: bool = False) -> np.ndarray:
        dt = np.dtype(np.int64) if counts else np.dtype(run.dtype)
        base = run.counts_offset if counts else run.offset
        if run.path not in self.fds:
            self.fds[run.path] = os.open(run.path, os.O_RDONLY)
        want = (stop - start) * dt.itemsize
        buf = bytearray()
        while len(buf) < want:
            got = os.pread(
                self.fds[run.path], want - len(buf), base + start * dt.itemsize + len(buf)
            )
            if not got:
                raise DatasetError(f"spilled run truncated ({run.path})")
            buf += got
        return np.frombuffer(buf, dt)

    def count(self, run: Run, keys: np.ndarray, side: str) -> np.ndarray:
        """``np.searchsorted(values, keys, side)`` over a raw run, one window read per key."""
        ts = np.searchsorted(run.fence, keys, side=side)
        out = np.empty(len(keys), np.int64)
        for i, (key, t) in enumerate(zip(keys, ts.tolist())):
            start, stop = max(0, (t - 1) * FENCE), min(run.length, t * FENCE)
            window = self.read(run, start, stop) if stop > start else run.fence[:0]
            out[i] = start + int(np.searchsorted(window, key, side=side))
        return out

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
