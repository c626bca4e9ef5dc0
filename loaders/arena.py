"""One array per column for several readers' pools: a mixture's sources side by side.

A mixture batch interleaves rows of several sources. With one pool per source, each source's rows
are gathered into an array of their own and then scattered into the batch, so every byte of a
batch (50-frame action windows: most of it) is copied twice. With the sources' pools as regions
of one array per column, a batch is one ``np.take`` over that array: the sources' row indices are
interleaved (8 bytes per row), not their values.

Each source has a region (rows ``[offset, offset + rows)``) in every shared column's array. A
reader asks for its pool through :meth:`PoolArena.allocate` (see ``RowGroupReader._allocate``);
a region too small for it is grown by laying the arrays out anew: every other reader's resident
rows are copied to their new place and its pool views are rebound, so no resident row is lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


class PoolArena:
    """Shared pool arrays for the readers registered with :meth:`register`.

    ``columns[source]`` maps a source's column names to the shared name (the mixture's); other
    columns of that source get a private array, as do columns decoding to another dtype than
    ``dtypes[name]`` (the batch's). A column is shared only while every reader that
    holds it decodes the same row shape and dtype (else the newcomer's copy stays private).
    """

    def __init__(
        self,
        columns: Mapping[int, Mapping[str, str]],
        dtypes: Mapping[str, np.dtype] | None = None,
    ):
        self.columns = {int(s): dict(m) for s, m in columns.items()}
        self.dtypes = {k: np.dtype(v) for k, v in (dtypes or {}).items()}  # required dtypes
        self.readers: dict[int, Any] = {}
        self.rows: dict[int, int] = {}  # region size per source
        self.offset: dict[int, int] = {}
        self.arrays: dict[str, np.ndarray] = {}
        self.relayouts = 0

    def register(self, source: int, reader: Any, rows: int = 0) -> None:
        """Give ``reader`` (source ``source``) its pool here, with a region of ``rows`` rows
        reserved up front (regions grow on demand)."""
        self.readers[int(source)] = reader
        reader.arena = self
        self.rows[int(source)] = max(int(rows), self.rows.get(int(source), 0))
        self._place()

    def _place(self) -> None:
        at = 0
        for s in sorted(self.rows):
            self.offset[s] = at
            at += self.rows[s]
        self.total = at

    def _source(self, reader: Any) -> int:
        for s, r in self.readers.items():
            if r is reader:
                return s
        raise ValueError("reader is not registered with this arena")

    def allocate(
        self, reader: Any, specs: Mapping[str, tuple[tuple[int, ...], np.dtype]], capacity: int
    ) -> tuple[dict[str, np.ndarray], dict[str, tuple[np.ndarray, int]]]:
        """Pool arrays of ``capacity`` rows for ``reader`` (column -> (row shape, dtype)): views
        of the shared arrays for its shared columns, fresh arrays for the rest; and, per shared
        column, (shared array, row offset of its region)."""
        s = self._source(reader)
        if capacity > self.rows[s]:
            self.rows[s] = int(capacity)
            self._relayout()
        off = self.offset[s]
        pool: dict[str, np.ndarray] = {}
        base: dict[str, tuple[np.ndarray, int]] = {}
        for c, (shape, dtype) in specs.items():
            name = self.columns.get(s, {}).get(c)
            if name is not None and self.dtypes.get(name, dtype) != dtype:
                name = None  # decodes to another dtype than the batch has: private
            arr = self.arrays.get(name) if name is not None else None
            if name is not None and arr is None:
                arr = self.arrays[name] = np.empty((self.total, *shape), dtype=dtype)
            if arr is not None and arr.shape[1:] == tuple(shape) and arr.dtype == dtype:
                pool[c] = arr[off : off + capacity]
                base[c] = (arr, off)
            else:
                pool[c] = np.empty((capacity, *shape), dtype=dtype)
        return pool, base

    def _relayout(self) -> None:
        """New arrays for the new region sizes; resident rows copied, readers' views rebound."""
        self._place()
        self.relayouts += 1
        new = {
            name: np.empty((self.total, *a.shape[1:]), dtype=a.dtype)
            for name, a in self.arrays.items()
        }
        for s, reader in self.readers.items():
            for c, (arr, off) in list(reader.pool_base.items()):
                name = self.columns[s][c]
                n = len(reader.pool[c])
                a, b = self.offset[s], self.offset[s] + n
                new[name][a:b] = arr[off : off + n]
                reader.pool[c] = new[name][a:b]
                reader.pool_base[c] = (new[name], a)
        self.arrays = new

    def __getstate__(self) -> dict:
        """Picklable (DataLoader workers): the arrays are not sent; each process fills its own."""
        state = self.__dict__.copy()
        state["arrays"] = {}
        return state
