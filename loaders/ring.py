"""A shared-memory ring of batch slots: how worker processes hand batches to the training process.

One ``multiprocessing.shared_memory`` segment per ring (one ring per rank and loader), cut into
equal slots, one per batch in flight. A batch's fixed-width arrays (numeric and bool columns,
windows, pads, decoded video) are copied into one slot one after the other, 64-byte aligned, and
travel as a small :class:`Layout` (name, dtype, shape, offset per array); everything else (task
strings, paths, object arrays) travels with it as ``extras``. The reader builds numpy views of
the slot: no copy, no per-tensor segment. A slot is reused as soon as the consumer moves on.

Segments are named ``ekring_<creating pid>_r<rank>_<n>``: after a kill -9 of the training
process, :func:`remove_stale_segments` (run before every new ring) unlinks those whose creating
process is gone. numpy only (no torch).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

from episodekit.core.store import pid_alive

PREFIX = "ekring_"
SHM_DIR = "/dev/shm"
ALIGN = 64
_counter = itertools.count()


class SharedMemoryError(RuntimeError):
    """The ring does not fit the free shared memory (``/dev/shm``) or the ring budget."""


@dataclass(frozen=True)
class Field:
    """One array of a batch in a slot: its key path (nested dicts), dtype, shape, byte offset."""

    path: tuple[str, ...]
    dtype: str
    shape: tuple[int, ...]
    offset: int


Layout = tuple[Field, ...]


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def split_batch(
    batch: Mapping[str, Any], path: tuple[str, ...] = ()
) -> tuple[list[tuple[tuple[str, ...], np.ndarray]], dict[tuple[str, ...], Any]]:
    """(fixed-width arrays, everything else) of a batch dict, by key path (dicts flattened)."""
    arrays: list[tuple[tuple[str, ...], np.ndarray]] = []
    extras: dict[tuple[str, ...], Any] = {}
    for key, value in batch.items():
        p = (*path, key)
        if isinstance(value, Mapping):
            a, e = split_batch(value, p)
            arrays += a
            extras.update(e)
        elif isinstance(value, np.ndarray) and value.dtype.kind in "biufc" and value.ndim:
            arrays.append((p, value))
        else:
            extras[p] = value
    return arrays, extras


def layout_of(arrays: list[tuple[tuple[str, ...], np.ndarray]]) -> tuple[Layout, int]:
    """Where each array goes in a slot, and the bytes they need."""
    fields, offset = [], 0
    for path, a in arrays:
        fields.append(Field(path, a.dtype.str, tuple(a.shape), offset))
        offset += _aligned(a.nbytes)
    return tuple(fields), offset


def slot_bytes_for(arrays: list[tuple[tuple[str, ...], np.ndarray]], rows: int) -> int:
    """Bytes of a slot that holds these arrays with ``rows`` rows each (the largest batch)."""
    total = 0
    for _, a in arrays:
        per_row = a.nbytes // max(a.shape[0], 1) if a.shape[0] else a.itemsize * _row(a)
        total += _aligned(per_row * max(rows, a.shape[0]))
    return max(total, ALIGN)


def _row(a: np.ndarray) -> int:
    return int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim > 1 else 1


def assemble(fields: Layout, buf: Any, extras: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    """The batch dict back: numpy views of ``buf`` for ``fields``, ``extras`` as they are."""
    out: dict[str, Any] = {}
    items = [(f.path, np.ndarray(f.shape, np.dtype(f.dtype), buf, f.offset)) for f in fields]
    for path, value in [*items, *extras.items()]:
        d = out
        for key in path[:-1]:
            d = d.setdefault(key, {})
        d[path[-1]] = value
    return out


def shm_free_bytes(path: str = SHM_DIR) -> int | None:
    """Free bytes of the shared-memory filesystem (None where there is no ``/dev/shm``)."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return int(st.f_bavail) * int(st.f_frsize)

    return True


def remove_stale_segments(directory: str = SHM_DIR) -> list[str]:
    """Unlink ring segments whose creating process is dead (left by a kill -9); their names."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in names:
        if not name.startswith(PREFIX):
            continue
        try:
            pid = int(name[len(PREFIX) :].split("_", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not pid_alive(pid):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return removed


def _open_untracked(name: str, create: bool = False, size: int = 0) -> shared_memory.SharedMemory:
    """A segment that multiprocessing's resource tracker never hears of: the ring unlinks its own
    segment (and the next start removes a dead process's). Before Python 3.13 every attach
    registers too, and workers sharing one tracker then unregister twice (a KeyError traceback
    on stderr); no registration at all is the simple way out."""
    register = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None  # type: ignore[assignment]
    try:
        return shared_memory.SharedMemory(name=name, create=create, size=size)
    finally:
        resource_tracker.register = register  # type: ignore[assignment]


class Ring:
    """``slots`` slots of ``slot_bytes`` in one segment. :meth:`create` in the training process,
    :meth:`attach` in a worker; :meth:`write` fills a slot, :meth:`read` views it."""

    def __init__(self, shm: shared_memory.SharedMemory, slot_bytes: int, slots: int, owner: bool):
        self.shm, self.slot_bytes, self.slots, self.owner = shm, int(slot_bytes), int(slots), owner
        self.name = shm.name
        self._last_key: list | None = None
        self._last_layout: tuple[Layout, int] = ((), 0)

    @classmethod
    def create(
        cls, slot_bytes: int, slots: int, rank: int = 0, budget_mb: float | None = None
    ) -> Ring:
        """A new ring; raises :class:`SharedMemoryError` (one line) when it cannot fit."""
        slot_bytes = _aligned(int(slot_bytes))
        need = slot_bytes * int(slots)
        mib = need / 2**20
        if budget_mb is not None and mib > budget_mb:
            raise SharedMemoryError(
                f"the loader's shared-memory ring needs {mib:,.1f} MiB ({slots} slots of "
                f"{slot_bytes / 2**20:,.1f} MiB) but ring_mb={budget_mb:g}: lower batch_size, "
                "num_workers or prefetch, or raise ring_mb"
            )
        remove_stale_segments()
        free = shm_free_bytes()
        if free is not None and need > free:
            raise SharedMemoryError(
                f"the loader's shared-memory ring needs {mib:,.1f} MiB ({slots} slots of "
                f"{slot_bytes / 2**20:,.1f} MiB) but {SHM_DIR} has {free / 2**20:,.1f} MiB free: "
                "lower batch_size, num_workers or prefetch, or give the container more shared "
                "memory (docker's shm-size)"
            )
        name = f"{PREFIX}{os.getpid()}_r{int(rank)}_{next(_counter)}_{os.urandom(3).hex()}"
        shm = _open_untracked(name, create=True, size=max(need, 1))
        return cls(shm, slot_bytes, slots, owner=True)

    @classmethod
    def attach(cls, name: str, slot_bytes: int, slots: int) -> Ring:
        return cls(_open_untracked(name), slot_bytes, slots, owner=False)

    def _buf(self, slot: int) -> memoryview:
        a = slot * self.slot_bytes
        return self.shm.buf[a : a + self.slot_bytes]

    def write(self, slot: int, arrays: list[tuple[tuple[str, ...], np.ndarray]]) -> Layout | None:
        """Copy ``arrays`` into ``slot``; their layout, or None when they do not fit. The layout
        of the last batch is reused when the arrays have its names, dtypes and shapes (every
        batch but an epoch's last: no Field objects made per batch, and the same object back)."""
        key = [(p, a.dtype, a.shape) for p, a in arrays]
        if key == self._last_key:
            fields, nbytes = self._last_layout
        else:
            fields, nbytes = layout_of(arrays)
            self._last_key, self._last_layout = key, (fields, nbytes)
        if nbytes > self.slot_bytes:
            return None
        buf = self._buf(slot)
        for f, (_, a) in zip(fields, arrays):
            dst = np.ndarray(a.shape, a.dtype, buf, f.offset)
            np.copyto(dst, a, casting="no")
        return fields

    def read(self, slot: int, fields: Layout, extras: Mapping) -> dict[str, Any]:
        """The batch in ``slot`` as numpy views (valid until the slot is written again)."""
        return assemble(fields, self._buf(slot), extras)

    def close(self) -> None:
        """Unmap (views still alive keep the mapping until they go) and, for the owner, unlink."""
        try:
            self.shm.close()
        except BufferError:  # a view is still alive: the mapping goes with the process
            pass
        if self.owner:
            unlink(self.name)


def unlink(name: str) -> None:
    """Remove a segment by name (no error when it is gone already)."""
    try:
        os.unlink(os.path.join(SHM_DIR, name.lstrip("/")))
    except FileNotFoundError:
        pass
    except OSError:  # pragma: no cover - no /dev/shm (not Linux)
        try:
            shared_memory.SharedMemory(name=name).unlink()
        except FileNotFoundError:
            pass
