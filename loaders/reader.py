"""Row-group-aware frame reading with a bounded cache of decoded row groups.

At open, the footer of each needed data file is read once: per row group its row count, which,
anchored on the episodes table (a file holds its episodes' frames contiguously, in index order),
gives a global sorted array of row-group start frames. A frame then maps to (file, row group) by
``searchsorted``: O(row groups) memory, and only the row groups that hold requested frames are ever
read (``ParquetFile.read_row_group``), whatever the file's size.

Decoded row groups live in a **pool**: one preallocated numpy array per column (capacity from
``cache_mb``), used as a ring: a new row group is written at the head and evicts whatever it
overlaps (FIFO). Because every resident frame has a pool position, a batch of frames is gathered
with one numpy fancy index per column, with no per-frame (or per-row-group) Python work.
Works on local paths and fsspec URLs (file handles stay open, a bounded number at a time), opened
through :func:`episodekit.core.parquet_read.open_data_file`; the decoding calls pyarrow's handle
directly (the hot path).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core.dataset import Dataset, DatasetError, InconsistentDatasetError
from episodekit.core.parquet_read import DataFile, FileMetaData, open_data_file
from episodekit.core.paths import MIB

DEFAULT_CACHE_MB = 96
MAX_OPEN_FILES = 32
# Open files keep their parsed footer: ~10x its serialized size in pyarrow (a recorded-layout
# file with 1,700 row groups holds ~12 MiB). Handles are closed beyond this budget.
DEFAULT_FOOTER_MB = 32
FOOTER_EXPANSION = 10
DECODE_BATCH_ROWS = 16_384  # hold() decodes a row group in batches of this many rows


def column_to_numpy(arr: pa.Array | pa.ChunkedArray, shape: tuple[int, ...] = ()) -> np.ndarray:
    """One decoded column as numpy with rows first: ``(n,)`` scalars, ``(n, *shape)`` vectors.

    fixed_size_list (and equal-length list) columns become 2-D (or N-D) numeric arrays; image
    structs become an object array of their ``bytes``; any other nested column (lists of
    structs or strings, structs, ragged lists of a scalar feature) an object array of each row's
    Python value (:func:`python_objects`).
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    n = len(arr)
    t = arr.type
    if pa.types.is_struct(t):
        if t.get_field_index("bytes") < 0:  # not an image: the row's value as Python objects
            return python_objects(arr)
        return arr.field("bytes").to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        values = arr
        while (
            pa.types.is_fixed_size_list(values.type)
            or pa.types.is_list(values.type)
            or pa.types.is_large_list(values.type)
        ):
            values = values.flatten()
        numeric = pa.types.is_integer(values.type) or pa.types.is_floating(values.type)
        if not (numeric or pa.types.is_boolean(values.type)):  # lists of structs, strings...
            return python_objects(arr)
        flat = values.to_numpy(zero_copy_only=False)
        width = flat.size // n if n else int(np.prod(shape or (1,)))
        if n and flat.size != n * width:
            if not shape:  # a list per row, not a declared vector: its values as they are
                return python_objects(arr)
            raise ValueError(f"list column of unequal lengths ({flat.size} values, {n} rows)")
        target = tuple(shape) if shape and int(np.prod(shape)) == width else (width,)
        return flat.reshape((n, *target))
    return arr.to_numpy(zero_copy_only=False)


def python_objects(arr: pa.Array) -> np.ndarray:
    """A column as a 1-D object array of each row's Python value (lists, dicts: what
    ``to_pylist`` gives; LeRobot's language columns, other nested columns)."""
    return np.fromiter(arr.to_pylist(), dtype=object, count=len(arr))


def _check_index_statistics(md: FileMetaData, first: int, path: str) -> None:
    """When the footer has statistics for ``index``, the file must start at frame ``first``
    (LeRobot's windows use ``index``; a file out of step with the episodes table is an error)."""
    if md.num_row_groups == 0:
        return
    rg = md.row_group(0)
    for j in range(rg.num_columns):
        col = rg.column(j)
        if col.path_in_schema == "index":
            stats = col.statistics
            if stats is not None and stats.has_min_max and int(stats.min) != first:
                raise InconsistentDatasetError(
                    f"first row has index {stats.min} but the episodes table puts frame {first} "
                    "there",
                    path,
                )
            return


class PoolRows:
    """Rows ``index`` of ``base`` (an arena array), not gathered yet: a batch built from several
    readers whose pools share ``base`` gathers all of its rows with one ``np.take``."""

    __slots__ = ("base", "index")

    def __init__(self, base: np.ndarray, index: np.ndarray):
        self.base, self.index = base, index

    def values(self) -> np.ndarray:
        return np.take(self.base, self.index, axis=0)


class RowGroupReader:
    """Frames of a dataset's data files, by global frame index, through a bounded row-group pool.

    ``columns`` maps column name -> row shape (``()`` for scalars). ``file_ids`` restricts the
    reader to some data files (a rank opens only its own); frames outside them are an error.
    """

    def __init__(
        self,
        ds: Dataset,
        columns: dict[str, tuple[int, ...]],
        file_ids: np.ndarray | None = None,
        cache_mb: float = DEFAULT_CACHE_MB,
        footer_mb: float = DEFAULT_FOOTER_MB,
    ):
        self.ds = ds
        self.columns = dict(columns)
        self.cache_bytes = max(0, int(cache_mb * MIB))
        self.footer_bytes = max(0, int(footer_mb * MIB))
        self._footer_cost: dict[int, int] = {}
        self.files_opened = 0
        file_id = ds.column("file_id").astype(np.int64)
        frm = ds.column("dataset_from_index")
        to = ds.column("dataset_to_index")
        if file_ids is None:
            file_ids = np.unique(file_id)
        self.file_ids = np.unique(np.asarray(file_ids, dtype=np.int64))
        self._handles: OrderedDict[int, DataFile] = OrderedDict()
        starts, rows, files, local = [], [], [], []
        for fid in self.file_ids.tolist():  # per file: read its footer once
            sel = file_id == fid
            first, last = int(frm[sel].min()), int(to[sel].max())
            expected = int((to[sel] - frm[sel]).sum())
            pf = self._open(fid)
            path = ds.data_path(fid)
            names = set(pf.schema.names)
            missing = [c for c in self.columns if c not in names]
            if missing:
                raise DatasetError(f"data file lacks feature columns {missing}", path)
            md = pf.metadata
            if md.num_rows != expected or last - first != expected:
                raise InconsistentDatasetError(
                    f"file has {md.num_rows} rows but its episodes cover {expected} frames "
                    f"[{first}, {last})",
                    path,
                )
            n_rg = md.num_row_groups
            r = np.fromiter((md.row_group(i).num_rows for i in range(n_rg)), np.int64, n_rg)
            _check_index_statistics(md, first, path)
            starts.append(first + np.cumsum(r) - r)
            rows.append(r)
            files.append(np.full(n_rg, fid, np.int64))
            local.append(np.arange(n_rg, dtype=np.int64))
        cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)  # noqa: E731
        order = np.argsort(cat(starts), kind="stable")
        self.rg_start = cat(starts)[order]
        self.rg_rows = cat(rows)[order]
        self.rg_file = cat(files)[order]
        self.rg_local = cat(local)[order]
        self.slot = np.full(len(self.rg_start), -1, dtype=np.int64)  # pool position or -1
        # rows [valid_lo, valid_hi) of a resident row group hold its data (hold() may decode a
        # row range only: the rows a bin's episodes need); load() always decodes whole ones
        self.valid_lo = np.zeros(len(self.rg_start), dtype=np.int64)
        self.valid_hi = self.rg_rows.copy()
        self.pool: dict[str, np.ndarray] = {}
        # column -> (shared array, row offset) when the pool of that column is a region of an
        # arena's array (a mixture's sources side by side: one gather serves all of them)
        self.pool_base: dict[str, tuple[np.ndarray, int]] = {}
        self.arena: Any = None  # set by the owner before the first decode
        self.capacity = 0
        self._head = 0
        self.row_groups_read = 0
        self.rows_decoded = 0  # rows parquet decoded for hold() (its row ranges stop early)
        self.rows_from: Any = None  # a FrameStore the pool is filled from (see use_store)
        self.rows_from_store = 0  # rows copied from it
        self.rg_decodes = np.zeros(len(self.rg_start), dtype=np.int64)  # decodes per row group
        self.rg_rows_decoded = np.zeros(len(self.rg_start), dtype=np.int64)  # rows, all decodes
        self._min_capacity = 0
        self._held: np.ndarray | None = None  # the row-group set of the last hold()
        self._last_hold: tuple | None = None  # its arguments, while nothing else moved
        self._held_at = np.zeros(0, dtype=np.int64)

    # -- files ---------------------------------------------------------------------------------

    def _open(self, fid: int) -> DataFile:
        pf = self._handles.get(fid)
        if pf is not None:
            self._handles.move_to_end(fid)
            return pf
        # this reader budgets its footers itself (footer_mb): a footer of its own per handle
        pf = open_data_file(self.ds.data_path(fid), self.ds.fs, shared_footer=False)
        self.files_opened += 1
        self._handles[fid] = pf
        self._footer_cost[fid] = pf.metadata.serialized_size * FOOTER_EXPANSION
        held = sum(self._footer_cost[f] for f in self._handles)
        while len(self._handles) > 1 and (
            len(self._handles) > MAX_OPEN_FILES or held > self.footer_bytes
        ):
            old, old_pf = self._handles.popitem(last=False)
            held -= self._footer_cost[old]
            self._release(old_pf)
        return pf

    def _release(self, pf: DataFile) -> None:
        """A handle leaves the reader: a remote file is closed now; a local one is dropped (it
        closes when the last reference goes: a row-group stream still reading it keeps it)."""
        if not self.ds.is_local:
            pf.close()

    def close(self) -> None:
        """Close open file handles (the pool stays valid)."""
        for pf in self._handles.values():
            self._release(pf)
        self._handles.clear()

    def __getstate__(self) -> dict:
        """Picklable for DataLoader workers: no file handles, an empty pool (each worker fills
        its own)."""
        state = self.__dict__.copy()
        state.update(
            _handles=OrderedDict(),
            pool={},
            pool_base={},
            capacity=0,
            _head=0,
        )
        state["rg_decodes"] = np.zeros(len(self.rg_start), dtype=np.int64)
        state["rg_rows_decoded"] = np.zeros(len(self.rg_start), dtype=np.int64)
        state["_held"] = None
        state["slot"] = np.full(len(self.rg_start), -1, dtype=np.int64)
        return state

    # -- lookup --------------------------------------------------------------------------------

    def rg_of(self, frames: np.ndarray) -> np.ndarray:
        """Row-group id (into ``rg_start``) of each global frame index."""
        frames = np.asarray(frames, dtype=np.int64)
        if len(self.rg_start) == 0:
            raise IndexError("reader holds no data files")
        rg = np.searchsorted(self.rg_start, frames, side="right") - 1
        ok = np.maximum(rg, 0)
        bad = (rg < 0) | (frames >= self.rg_start[ok] + self.rg_rows[ok])
        if bad.any():
            raise IndexError(f"frame {int(frames[bad][0])} is not in this reader's data files")
        return rg

    def single_row_group(self, first: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Per frame range [first, end): the row group holding all of it, or -1 if split."""
        a = self.rg_of(first)
        b = self.rg_of(np.maximum(np.asarray(end) - 1, first))
        return np.where(a == b, a, -1)

    # -- the pool ------------------------------------------------------------------------------

    def _allocate(self, table: dict[str, np.ndarray], rows: int) -> None:
        row_bytes = 0.0
        for _name, a in table.items():
            row_bytes += a.nbytes / max(1, len(a))
            if a.dtype == object and len(a):
                row_bytes += sum(len(x or b"") for x in a[:64]) / min(64, len(a))
        largest = int(self.rg_rows.max()) if len(self.rg_rows) else rows
        self.capacity = max(
            int(self.cache_bytes // max(row_bytes, 1.0)), largest, self._min_capacity, 1
        )
        specs = {name: (a.shape[1:], a.dtype) for name, a in table.items()}
        if self.arena is not None:  # some columns live in a region of the arena's arrays
            self.pool, self.pool_base = self.arena.allocate(self, specs, self.capacity)
        else:
            self.pool = {name: np.empty((self.capacity, *shp), dtype=dt)
                         for name, (shp, dt) in specs.items()}  # fmt: skip

    def complete(self, rgs: np.ndarray) -> np.ndarray:
        """Per row group: resident with all of its rows."""
        rgs = np.asarray(rgs, dtype=np.int64)
        return self.covers(rgs, 0, self.rg_rows[rgs])

    def covers(self, rgs: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Per row group: resident with (at least) its local rows [lo, hi)."""
        rgs = np.asarray(rgs, dtype=np.int64)
        return (self.slot[rgs] >= 0) & (self.valid_lo[rgs] <= lo) & (self.valid_hi[rgs] >= hi)

    def _decode(self, rg: int) -> dict[str, np.ndarray]:
        fid = int(self.rg_file[rg])
        pf = self._open(fid)
        try:
            t = pf.parquet.read_row_group(
                int(self.rg_local[rg]), columns=list(self.columns), use_threads=self.ds.is_local
            )
        except (OSError, pa.ArrowInvalid) as exc:
            raise DatasetError(
                f"cannot read row group {int(self.rg_local[rg])} ({exc})", self.ds.data_path(fid)
            ) from exc
        self.row_groups_read += 1
        self.rg_decodes[rg] += 1
        self.rg_rows_decoded[rg] += t.num_rows
        return {c: column_to_numpy(t.column(c), shape) for c, shape in self.columns.items()}

    def load(self, rgs: np.ndarray) -> None:
        """Make the given row groups resident (read those that are not); may evict others."""
        decoded = False
        for rg in np.unique(np.asarray(rgs, dtype=np.int64)).tolist():
            if self.complete(np.array([rg]))[0]:
                continue
            decoded = True
            self._held = None
            table = self._decode(rg)
            n = int(self.rg_rows[rg])
            if not self.pool:
                self._allocate(table, n)
            if self._head + n > self.capacity:
                self._head = 0
            a, b = self._head, self._head + n
            s = self.slot
            overlap = (s >= 0) & (s < b) & (s + self.rg_rows > a)
            s[overlap] = -1
            for name, values in table.items():
                self.pool[name][a:b] = values
            s[rg] = a
            self.valid_lo[rg], self.valid_hi[rg] = 0, n
            self._head = b
        if decoded:  # decoded arrow buffers are copied out: give them back to the OS now,
            pa.default_memory_pool().release_unused()  # else mimalloc keeps ~50 MiB around

    def hold(
        self,
        rgs: np.ndarray,
        need: np.ndarray | None = None,
        rows: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Reserve room for the row groups ``rgs`` together and decode those of ``need`` (default:
        all of ``rgs``) that are not resident yet, each once. ``rows`` (local ``lo``, ``hi`` per
        row group of ``need``) limits a decode to the rows needed: decoding stops at ``hi``, and
        rows before ``lo`` are not converted (a bin's slice of a row group shared with others).

        For readers that visit row groups in known sets (the stream's pools): a new set evicts
        everything and lays its members out from the ring's start, so decoding one member never
        evicts another; the ring grows when the set exceeds its capacity.
        """
        if self._last_hold is not None and all(
            a is b for a, b in zip(self._last_hold, (rgs, need, rows, self._held))
        ):  # the same arguments again (one stream part, batch after batch): nothing to do
            return
        args = (rgs, need, rows)
        rgs, need, lo, hi = self._ranges(rgs, need, rows)
        if self._held is None or not np.array_equal(self._held, rgs):
            if not np.isin(need, rgs).all():
                raise ValueError("hold: every row group of need must be in rgs")
            rows = self.rg_rows[rgs]
            total = int(rows.sum())
            self.slot[:] = -1
            self._head = 0
            self._held = rgs
            self._held_at = np.cumsum(rows) - rows
            if total > self._min_capacity:
                self._min_capacity = total
                if self.pool and self.capacity < total:  # reallocated (larger) on the next decode
                    self.pool, self.pool_base, self.capacity = {}, {}, 0
        decoded = False
        todo = np.flatnonzero(~self.covers(need, lo, hi))
        for rg, r0, r1 in zip(need[todo].tolist(), lo[todo].tolist(), hi[todo].tolist()):
            a = int(self._held_at[np.searchsorted(self._held, rg)])
            pos = a  # row 0 of the row group sits at a; rows before r0 are skipped
            full = r0 == 0 and r1 == int(self.rg_rows[rg])
            for part, m in self._decode_batches(rg, r0, r1):  # bounded temporaries, in place
                if part is not None:
                    if not self.pool:
                        self._allocate(part, int(self.rg_rows[rg]))
                    skip = max(r0 - (pos - a), 0)
                    for name, values in part.items():
                        self.pool[name][pos + skip : pos + m] = values[skip:]
                pos += m
            if pos - a != r1 and (full or pos - a < r1):
                raise InconsistentDatasetError(
                    f"row group {int(self.rg_local[rg])} gave {pos - a} rows, its footer says "
                    f"{int(self.rg_rows[rg])}",
                    self.ds.data_path(int(self.rg_file[rg])),
                )
            self.slot[rg] = a
            self.valid_lo[rg], self.valid_hi[rg] = r0, pos - a
            decoded = True
        self._last_hold = (*args, self._held)
        if decoded:
            pa.default_memory_pool().release_unused()

    def _ranges(
        self, rgs: np.ndarray, need: np.ndarray | None, rows: tuple | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """hold()'s arguments as (sorted unique rgs, sorted unique need, lo, hi per need)."""
        rgs = np.unique(np.asarray(rgs, dtype=np.int64))
        need = rgs if need is None else np.asarray(need, dtype=np.int64)
        if rows is None:
            need = np.unique(need)
            return rgs, need, np.zeros(len(need), np.int64), self.rg_rows[need]
        order = np.argsort(need, kind="stable")  # one range per row group: the hull asked for
        need = need[order]
        lo = np.asarray(rows[0], dtype=np.int64)[order]
        hi = np.asarray(rows[1], dtype=np.int64)[order]
        at = np.flatnonzero(np.r_[True, need[1:] != need[:-1]]) if len(need) else need
        if len(at) < len(need):
            lo, hi = np.minimum.reduceat(lo, at), np.maximum.reduceat(hi, at)
        return rgs, need[at], lo, hi

    def holding(
        self,
        rgs: np.ndarray,
        need: np.ndarray | None = None,
        rows: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> bool:
        """True when ``hold(rgs, need, rows)`` would neither decode nor move anything (rows
        already taken from the pool stay valid)."""
        rgs, need, lo, hi = self._ranges(rgs, need, rows)
        same = self._held is not None and np.array_equal(self._held, rgs)
        return bool(same and self.covers(need, lo, hi).all())

    def _decode_batches(
        self, rg: int, lo: int = 0, hi: int | None = None
    ) -> Iterator[tuple[dict[str, np.ndarray] | None, int]]:
        """Row group ``rg`` decoded in record batches of DECODE_BATCH_ROWS rows (a third of the
        peak memory of decoding it whole), counted like :meth:`_decode`: ``(columns, rows)`` per
        batch, columns None for a batch wholly before row ``lo``; stops once row ``hi`` is read
        (parquet decodes pages in order: the rows after ``hi`` are never decoded)."""
        hi = int(self.rg_rows[rg]) if hi is None else int(hi)
        if self.rows_from is not None:  # a frame store holds every column: copy, no decode
            yield from self._store_batches(rg, lo, hi)
            return
        fid = int(self.rg_file[rg])
        pf = self._open(fid)
        self.row_groups_read += 1
        self.rg_decodes[rg] += 1
        at = 0
        try:
            batches = pf.parquet.iter_batches(
                batch_size=DECODE_BATCH_ROWS,
                row_groups=[int(self.rg_local[rg])],
                columns=list(self.columns),
            )
            for b in batches:
                m = b.num_rows
                if at + m <= lo:
                    yield None, m
                else:
                    cols = self.columns.items()
                    yield {c: column_to_numpy(b.column(c), shape) for c, shape in cols}, m
                at += m
                self.rows_decoded += m
                self.rg_rows_decoded[rg] += m
                if at >= hi:
                    break
        except (OSError, pa.ArrowInvalid) as exc:
            raise DatasetError(
                f"cannot read row group {int(self.rg_local[rg])} ({exc})", self.ds.data_path(fid)
            ) from exc

    def _store_batches(
        self, rg: int, lo: int, hi: int
    ) -> Iterator[tuple[dict[str, np.ndarray] | None, int]]:
        """Rows [lo, hi) of row group ``rg`` from the frame store ``rows_from`` (memory-mapped),
        in :meth:`_decode_batches`' shape; nothing before ``lo`` is read."""
        store = self.rows_from
        at0 = int(self.rg_start[rg]) - store.base
        self.rows_from_store += hi - lo
        if lo:
            yield None, lo
        for a in range(lo, hi, DECODE_BATCH_ROWS):
            b = min(hi, a + DECODE_BATCH_ROWS)
            yield {c: store.columns[c][at0 + a : at0 + b] for c in self.columns}, b - a

    def use_store(self, store: Any) -> bool:
        """Fill the pool from ``store`` (a :class:`~episodekit.loaders.store.FrameStore` of this
        dataset) instead of decoding parquet, when it holds every column with the row shapes
        asked for; returns whether it does."""
        cols = getattr(store, "columns", {})
        if all(c in cols and cols[c].shape[1:] == tuple(s) for c, s in self.columns.items()):
            self.rows_from = store
            return True
        return False

    def _resident_frames(self, rgs: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """Per frame (in row group ``rgs``): its row is resident."""
        local = frames - self.rg_start[rgs]
        return self.covers(rgs, local, local + 1)

    def resident_bytes(self) -> int:
        """Bytes held by the pool arrays (their capacity)."""
        return sum(a.nbytes for a in self.pool.values())

    def gather(self, requests: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        """Values of column ``c`` at global frames ``f`` (any shape) for each ``(c, f)``.

        Reads what is missing. Fully vectorized when the needed row groups fit in the pool
        together; otherwise one pass per needed row group (each copied out before the next read
        may evict it).
        """
        flat = [np.asarray(f, dtype=np.int64).ravel() for _, f in requests]
        rgs = [self.rg_of(f) for f in flat]
        needed = np.unique(np.concatenate(rgs)) if rgs else np.zeros(0, np.int64)
        # frames resident already (a held row range counts) are not read again
        held = [self._resident_frames(r, f) for r, f in zip(rgs, flat)]
        self.load(np.unique(np.concatenate([r[~h] for r, h in zip(rgs, held)] or [needed])))
        out = []
        if needed.size == 0 or all(self._resident_frames(r, f).all() for r, f in zip(rgs, flat)):
            for (c, _), f, r in zip(requests, flat, rgs):
                out.append(np.take(self.pool[c], self.slot[r] + (f - self.rg_start[r]), axis=0))
        else:  # the request does not fit in the pool at once: row group by row group
            for (c, _), f in zip(requests, flat):
                out.append(np.empty((len(f), *self.pool[c].shape[1:]), self.pool[c].dtype))
            for rg in needed.tolist():
                self.load(np.array([rg]))
                base = self.slot[rg] - self.rg_start[rg]
                for (c, _), f, r, o in zip(requests, flat, rgs, out):
                    sel = r == rg
                    o[sel] = self.pool[c][f[sel] + base]
        return [v.reshape((*np.shape(f), *v.shape[1:])) for (_, f), v in zip(requests, out)]
