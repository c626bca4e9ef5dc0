"""Per-column checksums of a table's values, independent of how the rows are split into batches.

The rewrite compares the checksums of the source (computed while streaming it) with those of the
written temporary file (computed by streaming it back) before replacing anything. Hashing arrow
buffers per batch would not do: the same values arrive in different batch boundaries and buffer
offsets on each side. Instead every column is normalized into a few byte *streams* (validity,
lengths, flat values), each fed in row order to a :class:`WordSum`, so the result depends on the
values only.

:class:`WordSum` reads a stream as little-endian 64-bit words ``w_k`` (k = global word position)
and keeps ``len``, ``sum(w_k)`` and ``sum(w_k * (2k + 1))`` modulo 2**64. It is linear, so a
word split across two batches adds up to the same total, and it runs at numpy ``dot`` speed
(several GB/s, ~5x sha1). Any single changed word changes the weighted sum for certain (an odd
factor is invertible modulo 2**64); reordered or multiply-changed words are caught unless they
cancel exactly, which accidental corruption and pipeline bugs do not do. It is not a defence
against deliberate forgery, and does not need to be.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MASK = (1 << 64) - 1
_CHUNK_WORDS = 1 << 18
_WEIGHTS = 2 * np.arange(_CHUNK_WORDS, dtype=np.uint64) + np.uint64(1)
_BYTE_SHIFTS = [1 << (8 * j) for j in range(8)]


class WordSum:
    """Position-weighted sums of a byte stream's 64-bit words (see the module docstring)."""

    __slots__ = ("nbytes", "s0", "s1")

    def __init__(self) -> None:
        self.nbytes = 0  # bytes fed so far = global byte position of the next byte
        self.s0 = 0
        self.s1 = 0

    def _partial(self, data: np.ndarray) -> None:
        """Bytes that do not fill a whole aligned word: each adds byte * 256**j * (2k + 1)."""
        for i, b in enumerate(data.tolist()):  # at most 7 bytes at each end of a batch
            q = self.nbytes + i
            v = b * _BYTE_SHIFTS[q % 8]
            self.s0 = (self.s0 + v) & MASK
            self.s1 = (self.s1 + v * (2 * (q // 8) + 1)) & MASK
        self.nbytes += len(data)

    def update(self, data: memoryview | bytes) -> None:
        """Feed the next bytes of the stream."""
        buf = np.frombuffer(data, dtype=np.uint8)
        head = min((-self.nbytes) % 8, len(buf))
        if head:
            self._partial(buf[:head])
        whole = (len(buf) - head) // 8 * 8
        words = buf[head : head + whole].view("<u8")
        k0 = self.nbytes // 8
        for o in range(0, len(words), _CHUNK_WORDS):
            w = words[o : o + _CHUNK_WORDS]
            total = int(w.sum(dtype=np.uint64))
            weighted = int(np.dot(w, _WEIGHTS[: len(w)]))
            # sum w_i (2(k0 + o + i) + 1) = sum w_i (2i + 1) + 2 (k0 + o) sum w_i
            self.s0 = (self.s0 + total) & MASK
            self.s1 = (self.s1 + weighted + 2 * (k0 + o) * total) & MASK
        self.nbytes += whole
        if head + whole < len(buf):
            self._partial(buf[head + whole :])

    def digest(self) -> bytes:
        return b"".join(x.to_bytes(8, "little") for x in (self.nbytes, self.s0, self.s1))


def _bytes(values: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(values)).cast("B")


class TableChecksum:
    """Accumulates one digest per top-level column over batches fed in row order."""

    def __init__(self) -> None:
        self._streams: dict[tuple[str, str, str], WordSum] = {}
        self.num_rows = 0

    def _feed(self, column: str, path: str, kind: str, data: memoryview | bytes) -> None:
        h = self._streams.get((column, path, kind))
        if h is None:
            h = self._streams[(column, path, kind)] = WordSum()
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

    def update(self, batch: pa.RecordBatch | pa.Table, contiguous: bool = False) -> None:
        """Feed the next rows (all columns) in row order. ``contiguous``: join each column's
        chunks first, one column at a time (many small batches cost one pass, and only one
        column is copied at once)."""
        for name in batch.schema.names:
            col = batch.column(name)
            if contiguous and isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks()
            self._array(name, "", col)
        self.num_rows += batch.num_rows

    def digests(self) -> dict[str, str]:
        """Top-level column name -> hex digest over all of its streams."""
        out: dict[str, hashlib._Hash] = {}
        for (column, path, kind), h in sorted(self._streams.items()):
            agg = out.setdefault(column, hashlib.sha1())
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
