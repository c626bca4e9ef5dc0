"""The whole row groups a salvage found (:mod:`episodekit.core.parquet_salvage`), held packed:
their places and rows in arrays (uint32 where the values fit), their encoded ``RowGroup``
structs (what a footer lists) concatenated and zlib-compressed :data:`BLOCK` at a time, each
full block spilled to an unnamed temporary file (read back with ``pread`` when asked): what
stays in memory is ~20 bytes a group (its start, byte length, rows and struct size) and the
last, partial block, however many groups.

A recording LeRobot's recorder left has one row group per episode: held as one Python object
and one ``bytes`` each, 100,000 of them took ~85 MB (data file, ~750 bytes a struct) and
~120 MB (``meta/episodes`` file, ~10 KB); the structs of consecutive groups differ in little
but offsets and statistics, and compress ~6x; held compressed in memory, they still grew
~0.3 KB an episode (~30 MB at 100,000 episodes: the structs of both files), so the blocks go to
disk. :class:`Groups` is a read-only sequence of
:class:`Group` (what the salvage code and its tests index, slice and iterate); the structs are
read back in order (footers, windows) a block at a time.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from array import array
from collections.abc import Iterator, Sequence
from typing import NamedTuple, overload

import numpy as np

BLOCK = 256  # structs compressed together (~190 KB of a data file's, ~2.5 MB of meta's)
_NP = {"I": np.uint32, "q": np.int64}


def _add(values: array, v: int) -> array:
    """``values`` with ``v`` appended: a uint32 array becomes int64 when ``v`` does not fit."""
    if values.typecode == "I" and not 0 <= v <= 0xFFFFFFFF:
        values = array("q", values)
    values.append(v)
    return values


class Group(NamedTuple):
    """A whole row group found: where it starts and ends, its rows, its encoded ``RowGroup``
    struct (what the footer lists)."""

    start: int
    end: int
    num_rows: int
    meta: bytes


class _Spill:
    """Compressed blocks appended to an unnamed temporary file (gone with the process however
    it ends), each read back by its place."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="episodekit-groups-")
        self.size = 0

    def put(self, data: bytes) -> tuple[int, int]:
        """Append ``data``; its place (offset, length)."""
        at = self.size
        view = memoryview(data)
        while view:
            n = os.pwrite(self._file.fileno(), view, self.size)
            view, self.size = view[n:], self.size + n
        return at, len(data)

    def get(self, place: tuple[int, int]) -> bytes:
        at, n = place
        out = bytearray()
        while len(out) < n:
            got = os.pread(self._file.fileno(), n - len(out), at + len(out))
            if not got:
                raise OSError(f"spilled row-group structs cut short at {at + len(out)}")
            out += got
        return bytes(out)


class Groups(Sequence[Group]):
    """Row groups in file order, appended one at a time (:meth:`append`), then read."""

    def __init__(self, groups: Sequence[Group] = ()) -> None:
        self._start = array("q")
        self._len = array("I")  # end - start
        self._rows = array("I")
        self._size = array("I")  # bytes of each struct
        self._blocks: list[tuple[int, int]] = []  # places in _spill, BLOCK structs each
        self._spill: _Spill | None = None  # shared by prefixes
        self._tail = bytearray()  # the structs after the last full block, as they are
        self._cached: tuple[int, bytes, np.ndarray] | None = None  # block, bytes, offsets
        for g in groups:
            self.append(g)

    def append(self, g: Group) -> None:
        self._start.append(g.start)
        self._len = _add(self._len, g.end - g.start)
        self._rows = _add(self._rows, g.num_rows)
        self._size = _add(self._size, len(g.meta))
        self._tail += g.meta
        if len(self._size) % BLOCK == 0:
            if self._spill is None:
                self._spill = _Spill()
            self._blocks.append(self._spill.put(zlib.compress(bytes(self._tail), 1)))
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
        return Group(self._start[i], self._start[i] + self._len[i], self._rows[i], self.struct(i))

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
        if b < len(self._blocks):
            assert self._spill is not None
            data = zlib.decompress(self._spill.get(self._blocks[b]))
        else:
            data = bytes(self._tail)
        sizes = np.frombuffer(self._size, _NP[self._size.typecode])[b * BLOCK : (b + 1) * BLOCK]
        sizes = sizes.astype(np.int64)
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
            yield self[i]

    def rows(self) -> np.ndarray:
        """Rows of each group (int64)."""
        return np.array(self._rows, np.int64)

    def last_end(self) -> int:
        """Where the last group ends (no struct read)."""
        return self._start[-1] + self._len[-1]

    def prefix(self, n: int) -> Groups:
        """The first ``n`` groups (the full blocks shared, not copied)."""
        n = max(0, min(n, len(self)))
        out = Groups()
        out._start, out._len = self._start[:n], self._len[:n]
        out._rows, out._size = self._rows[:n], self._size[:n]
        full = n // BLOCK
        out._blocks, out._spill = self._blocks[:full], self._spill
        if n % BLOCK:
            data, offsets = self._block(full)
            out._tail = bytearray(data[: int(offsets[n % BLOCK])])
        return out

    def places(self) -> Groups:
        """The same groups without their structs (each ``meta`` is ``b""``)."""
        out = Groups()
        out._start, out._len, out._rows = self._start[:], self._len[:], self._rows[:]
        out._size = array("I", bytes(4 * len(self)))
        return out

    def held_bytes(self) -> int:
        """Bytes of structs held in memory (the spilled blocks are on disk)."""
        return len(self._tail)

    def spilled_bytes(self) -> int:
        """Bytes of compressed structs in the temporary file."""
        return sum(n for _, n in self._blocks)

    def __reduce__(self):  # pickled for executor jobs: the compressed blocks themselves
        spill = self._spill
        blocks = [spill.get(p) for p in self._blocks] if spill is not None else []
        state = (self._start, self._len, self._rows, self._size, blocks, bytes(self._tail))
        return _unpickle, state


def _unpickle(start, length, rows, size, blocks, tail) -> Groups:
    out = Groups()
    out._start, out._len, out._rows, out._size = start, length, rows, size
    if blocks:
        out._spill = _Spill()
        out._blocks = [out._spill.put(b) for b in blocks]
    out._tail = bytearray(tail)
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
