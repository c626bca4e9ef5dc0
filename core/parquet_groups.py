"""The whole row groups a salvage found (:mod:`episodekit.core.parquet_salvage`), held packed:
their places and rows in int64 arrays, their encoded ``RowGroup`` structs (what a footer lists)
concatenated and zlib-compressed :data:`BLOCK` at a time.

A recording LeRobot's recorder left has one row group per episode: held as one Python object
and one ``bytes`` each, 100,000 of them took ~85 MB (data file, ~750 bytes a struct) and
~120 MB (``meta/episodes`` file, ~10 KB); the structs of consecutive groups differ in little
but offsets and statistics, and compress ~6x. :class:`Groups` is a read-only sequence of
:class:`Group` (what the salvage code and its tests index, slice and iterate); the structs are
read back in order (footers, windows) a block at a time.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterator, Sequence
from typing import NamedTuple, overload

import numpy as np

BLOCK = 256  # structs compressed together (~190 KB of a data file's, ~2.5 MB of meta's)


class Group(NamedTuple):
    """A whole row group found: where it starts and ends, its rows, its encoded ``RowGroup``
    struct (what the footer lists)."""

    start: int
    end: int
    num_rows: int
    meta: bytes


class Groups(Sequence[Group]):
    """Row groups in file order, appended one at a time (:meth:`append`), then read."""

    def __init__(self, groups: Sequence[Group] = ()) -> None:
        self._start = array("q")
        self._end = array("q")
        self._rows = array("q")
        self._size = array("q")  # bytes of each struct
        self._blocks: list[bytes] = []  # compressed, BLOCK structs each
        self._tail = bytearray()  # the structs after the last full block, as they are
        self._cached: tuple[int, bytes, np.ndarray] | None = None  # block, bytes, offsets
        for g in groups:
            self.append(g)

    def append(self, g: Group) -> None:
        self._start.append(g.start)
        self._end.append(g.end)
        self._rows.append(g.num_rows)
        self._size.append(len(g.meta))
        self._tail += g.meta
        if len(self._size) % BLOCK == 0:
            self._blocks.append(zlib.compress(bytes(self._tail), 1))
            self._tail = bytearray()

    def __len__(self) -> int:
        return len(self._size)

    @overload
    def __getitem__(self, i: int) -> Group: ...
    @overload
    def __getitem__(self, i: slice) -> Groups: ...
    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if start == 0 and step == 1:
                return self.prefix(stop)
            return Groups([self[k] for k in range(start, stop, step)])
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("row group index out of range")
        return Group(self._start[i], self._end[i], self._rows[i], self.struct(i))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Groups, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Groups({len(self)} row groups, {self.rows().sum()} rows)"

    def _block(self, b: int) -> tuple[bytes, np.ndarray]:
        """The structs of block ``b`` as one string and where each starts (and the end)."""
        if self._cached is not None and self._cached[0] == b:
            return self._cached[1], self._cached[2]
        # past the blocks: the tail (or, of :meth:`places`, no struct at all)
        data = zlib.decompress(self._blocks[b]) if b < len(self._blocks) else bytes(self._tail)
        sizes = np.frombuffer(self._size, np.int64)[b * BLOCK : (b + 1) * BLOCK]
        offsets = np.r_[0, np.cumsum(sizes)]
        self._cached = (b, data, offsets)
        return data, offsets

    def struct(self, i: int) -> bytes:
        """The encoded ``RowGroup`` struct of group ``i``."""
        data, offsets = self._block(i // BLOCK)
        k = i % BLOCK
        return data[int(offsets[k]) : int(offsets[k + 1])]

    def structs(self) -> _Structs:
        """The encoded structs as a sequence of ``bytes`` (each decompressed when asked)."""
        return _Structs(self)

    def __iter__(self) -> Iterator[Group]:
        for i in range(len(self)):
            yield Group(self._start[i], self._end[i], self._rows[i], self.struct(i))

    def rows(self) -> np.ndarray:
        """Rows of each group (int64)."""
        return np.array(self._rows, np.int64)

    def last_end(self) -> int:
        """Where the last group ends (no struct read)."""
        return self._end[-1]

    def prefix(self, n: int) -> Groups:
        """The first ``n`` groups (the full blocks shared, not copied)."""
        n = max(0, min(n, len(self)))
        out = Groups()
        out._start, out._end = self._start[:n], self._end[:n]
        out._rows, out._size = self._rows[:n], self._size[:n]
        full = n // BLOCK
        out._blocks = self._blocks[:full]
        if n % BLOCK:
            data, offsets = self._block(full)
            out._tail = bytearray(data[: int(offsets[n % BLOCK])])
        return out

    def places(self) -> Groups:
        """The same groups without their structs (each ``meta`` is ``b""``)."""
        out = Groups()
        out._start, out._end, out._rows = self._start[:], self._end[:], self._rows[:]
        out._size = array("q", bytes(8 * len(self)))
        return out

    def __reduce__(self):  # pickled for executor jobs: the packed form as it is
        state = (self._start, self._end, self._rows, self._size, self._blocks, bytes(self._tail))
        return _unpickle, state


def _unpickle(start, end, rows, size, blocks, tail) -> Groups:
    out = Groups()
    out._start, out._end, out._rows, out._size = start, end, rows, size
    out._blocks, out._tail = list(blocks), bytearray(tail)
    return out


class _Structs(Sequence[bytes]):
    """:meth:`Groups.structs`."""

    def __init__(self, groups: Groups) -> None:
        self._groups = groups

    def __len__(self) -> int:
        return len(self._groups)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._groups.struct(k) for k in range(*i.indices(len(self)))]
        return self._groups.struct(i if i >= 0 else i + len(self))

    def __iter__(self) -> Iterator[bytes]:
        for i in range(len(self._groups)):
            yield self._groups.struct(i)


__all__ = ["BLOCK", "Group", "Groups"]
