"""Per-column checksums of a table's values, independent of how the rows are split into batches.

The rewrite compares the checksums of the source (computed while streaming it) with those of the
written temporary file (computed by streaming it back) before replacing anything. Hashing arrow
buffers per batch would not do: the same values arrive in different batch boundaries and buffer
offsets on each side. Instead every column is normalized into a few byte *streams* (validity,
lengths, flat values) and each stream is fed to its own hash object in row order, so the digest
depends on the values only. A single changed value, null or length changes the digest.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

HASH = "sha1"  # detects accidental differences; not a security boundary; fastest here


def _bytes(values: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(values)).cast("B")


class TableChecksum:
    """Accumulates one digest per top-level column over batches fed in row order."""

    def __init__(self) -> None:
        self._streams: dict[tuple[str, str, str], hashlib._Hash] = {}
        self.num_rows = 0

    def _feed(self, column: str, path: str, kind: str, data: memoryview | bytes) -> None:
        h = self._streams.get((column, path, kind))
        if h is None:
            h = self._streams[(column, path, kind)] = hashlib.new(HASH)
        h.update(data)

    def _array(self, column: str, path: str, arr: pa.Array | pa.ChunkedArray) -> None:
        """Feed one array (any supported type) as normalized streams of ``column``/``path``."""
        if isinstance(arr, pa.ChunkedArray):
            for chunk in arr.chunks:
                self._array(column, path, chunk)
            return
        t = arr.type
        if pa.types.is_dictionary(t):
            self._array(column, path, arr.dictionary_decode())
            return
        valid = None
        if arr.null_count:
            valid = pc.is_valid(arr).to_numpy(zero_copy_only=False)
            self._feed(column, path, "valid", _bytes(valid.view(np.uint8)))
        else:
            # The same bytes the branch above gives for an all-valid batch.
            self._feed(column, path, "valid", b"\x01" * len(arr))
        if pa.types.is_fixed_size_list(t):
            # flatten() skips null slots (their child values are undefined) and honours offsets.
            self._array(column, path + "/item", arr.flatten())
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            lengths = pc.list_value_length(arr).fill_null(0).cast(pa.int64())
            self._feed(column, path, "len", _bytes(lengths.to_numpy()))
            self._array(column, path + "/item", arr.flatten())
        elif pa.types.is_struct(t):
            for field, child in zip(t, arr.flatten()):
                self._array(column, f"{path}/{field.name}", child)
        elif (
            pa.types.is_binary(t)
            or pa.types.is_string(t)
            or pa.types.is_large_binary(t)
            or pa.types.is_large_string(t)
        ):
            if not pa.types.is_large_binary(t):
                arr = arr.cast(pa.large_binary())
            if arr.null_count:
                arr = arr.fill_null(b"")
            lengths = pc.binary_length(arr).cast(pa.int64()).to_numpy()
            self._feed(column, path, "len", _bytes(lengths))
            offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)
            lo, hi = int(offsets[arr.offset]), int(offsets[arr.offset + len(arr)])
            if hi > lo:
                self._feed(column, path, "data", memoryview(arr.buffers()[2])[lo:hi])
        elif pa.types.is_boolean(t):
            values = arr.fill_null(False) if arr.null_count else arr
            data = values.to_numpy(zero_copy_only=False).view(np.uint8)
            self._feed(column, path, "data", _bytes(data))
        elif pa.types.is_null(t):
            pass
        else:
            self._feed(column, path, "data", _fixed_width_values(arr, valid))

    def update(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Feed the next rows (all columns) in row order."""
        for name, col in zip(batch.schema.names, batch.columns):
            self._array(name, "", col)
        self.num_rows += batch.num_rows

    def digests(self) -> dict[str, str]:
        """Top-level column name -> hex digest over all of its streams."""
        out: dict[str, hashlib._Hash] = {}
        for (column, path, kind), h in sorted(self._streams.items()):
            agg = out.setdefault(column, hashlib.new(HASH))
            agg.update(f"{path}\0{kind}\0".encode() + h.digest())
        return {k: v.hexdigest() for k, v in out.items()}


def _fixed_width_values(arr: pa.Array, valid: np.ndarray | None) -> memoryview:
    """Raw bytes of a fixed-width array's values (ints, floats, temporals, decimals), with the
    undefined bytes under null slots zeroed."""
    t = arr.type
    try:
        width = t.bit_width // 8
    except ValueError as exc:
        raise TypeError(f"cannot checksum arrow type {t}") from exc
    buf = arr.buffers()[1]
    raw = np.frombuffer(buf, dtype=np.uint8)[arr.offset * width : (arr.offset + len(arr)) * width]
    if valid is not None:
        raw = raw.reshape(len(arr), width).copy()
        raw[~valid] = 0
    return _bytes(raw)
