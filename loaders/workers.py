"""Worker processes that make numbered batches into a shared-memory ring, and the ordered reader.

:class:`BatchLoader` iterates a :class:`~episodekit.loaders.sources.BatchSource` epoch by epoch:
in-process with ``num_workers=0``, else through ``num_workers`` processes (started with 'fork' on
Linux when that is safe, else 'spawn': :mod:`~episodekit.loaders.process_start`; each unpickles
the source and opens its own readers). Worker ``w`` of ``N`` makes
batches ``w, w + N, ...`` of the epoch and copies each into one of its ``prefetch`` slots of the
ring (:mod:`~episodekit.loaders.ring`); the reader takes batch ``b`` from worker ``b % N``, so the
batches come in the same order as in-process, whatever ``N``. A source any process can serve at
the same cost (``BatchSource.any_worker``: random access) is shared out as the workers get free
instead: each takes the next batch number from a counter in shared memory (under a lock, tagged
with the epoch's generation), so a worker that starts late or is descheduled on a loaded machine
holds up nothing but its own batches, and the reader takes batch ``b`` from whichever worker
says it made it (the same batches, the same order). A batch is numpy views of its slot:
valid until the next batch is asked for (the slot then goes back to its worker).

Slots go back through shared memory, not a message per slot: worker ``w`` fills its slots in
turn (its ``j``-th batch of the epoch in its slot ``j % prefetch``), and the training process
counts the batches of ``w`` it is done with in a shared array (``released[w]``), so the worker
may write its ``j``-th batch once ``j - prefetch + 1`` of them are released. A worker finds out
without reading anything; only a worker that has no free slot waits, on its semaphore, which
each release posts (a futex: no system call when nobody waits) as does every message sent to it.
Each batch still tells the training process which slot holds it (one small message: the slot,
the task strings and other extras, and the arrays' layout only when it changed).

Each worker's very first batch travels pickled, with its arrays' shapes: the ring is sized from it
(``max_rows`` rows per slot) and created then by the training process, which checks the free
space of ``/dev/shm`` first. Workers exit when the training process goes away (they watch its
pid and their pipe) and unlink the ring; ``close()``, the context manager, garbage collection and
interpreter exit all stop them. numpy only (no torch).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import pickle
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from episodekit.loaders.process_start import StderrRelay, choose_start_method, died
from episodekit.loaders.ring import Ring, remove_stale_segments, slot_bytes_for, split_batch, unlink
from episodekit.loaders.sources import BatchSource

POLL_S = 0.5  # how often a waiting process checks that its peer is alive
STOP_S = 5.0  # how long close() waits for workers before terminating them


class WorkerError(RuntimeError):
    """A loader worker failed (its exception's message) or died."""


def _describe(exc: BaseException) -> tuple[str, str]:
    return f"{type(exc).__name__}: {exc}", traceback.format_exc()


class _Worker:
    """The loop of one worker process (see the module docstring)."""

    def __init__(
        self,
        source: BatchSource,
        w: int,
        n: int,
        conn: Any,
        parent_pid: int,
        released: Any = None,
        wake: Any = None,
        claim: Any = None,
    ):
        self.source, self.w, self.n, self.conn, self.parent_pid = source, w, n, conn, parent_pid
        self.released, self.wake = released, wake  # (shared counts, this worker's semaphore)
        self.claim = claim  # (lock, [generation, next batch]) when batches are shared out
        self.ring: Ring | None = None
        self.ids: list[int] = []
        self.gen = -1
        self.pending: tuple | None = None
        self.unslotted = 0  # batches sent pickled before the ring existed
        self.written = 0  # batches of this epoch written to slots
        self.base = 0  # released[w] when this epoch began
        self.sent_fields: Any = None  # the layout last sent (the next is sent only if it differs)

    def recv(self) -> tuple | None:
        """The next message, or None when the training process is gone (its pipe end closes;
        :func:`_watch_parent` covers a parent whose end lives on in a forked child)."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return None

    def handle(self, msg: tuple) -> bool:
        """Apply a message; True for a start/stop, which ends the current epoch."""
        if msg[0] == "slots":
            _, name, slot_bytes, slots, self.ids = msg
            self.ring = Ring.attach(name, slot_bytes, slots)
            return False
        self.pending = msg
        return True

    def slot_free(self) -> bool:
        """Whether the slot of the next batch is free: the batch it held (``prefetch`` batches
        back) is released (read from shared memory: no message)."""
        if self.ring is None:
            return False
        return self.released[self.w] - self.base > self.written - len(self.ids)

    def wait_slot(self) -> bool:
        """Block until a slot is free (or the ring exists); False on start/stop/parent gone."""
        while not self.slot_free():
            if self.conn.poll():
                msg = self.recv()
                if msg is None:
                    self.pending = ("stop",)
                    return False
                if self.handle(msg):
                    return False
            else:  # every release and every message posts it; the timeout is a safety net
                self.wake.acquire(timeout=POLL_S)
        return True

    def run(self) -> None:
        try:
            self.source.open()
            failed = None
        except Exception as exc:
            failed = _describe(exc)
        while True:
            msg, self.pending = self.pending or self.recv(), None
            if msg is None or msg[0] == "stop":
                return
            if msg[0] != "start":
                self.handle(msg)
            elif failed is not None:
                self.conn.send(("error", msg[1], -1, *failed))
            else:
                self.epoch(*msg[1:])

    def epoch(self, gen: int, state: Mapping[str, Any], n: int, base: int) -> None:
        # every slot is free again: the training process releases none of the last epoch's
        # slots after this start, and ``base`` counts all it released before it
        self.gen, self.base, self.written = gen, base, 0
        self.unslotted = 0  # (no ring yet: this epoch's first batch goes pickled, and makes it)
        try:
            self.source.begin(state)
        except Exception as exc:
            self.conn.send(("error", gen, -1, *_describe(exc)))
            return
        # messages are read only when no slot is free: a new start/stop is seen after at most
        # `prefetch` more batches (no poll per batch on the hot path)
        b = self.w - self.n
        while True:
            if (self.ring is None and self.unslotted) and not self.wait_slot():
                return
            b = self.next_batch(b, n)
            if b is None:
                return
            try:
                batch = self.source.batch(b)
            except Exception as exc:
                self.conn.send(("error", gen, b, *_describe(exc)))
                return
            self.send(gen, b, batch)
            if self.pending is not None:
                return

    def next_batch(self, b: int, n: int) -> int | None:
        """The batch to make after ``b``: every N-th, or the next one nobody took (shared
        out: the counter is this epoch's, else a new start is on its way); None when done."""
        if self.claim is None:
            b += self.n
            return b if b < n else None
        lock, counter = self.claim
        with lock:
            if counter[0] != self.gen or counter[1] >= n:
                return None
            b = int(counter[1])
            counter[1] = b + 1
        return b

    def send(self, gen: int, b: int, batch: dict[str, Any]) -> None:
        if self.ring is None:
            self.unslotted += 1
            self.conn.send(("data", gen, b, batch))
            return
        if not self.wait_slot():
            return
        self.wake.acquire(False)  # (one post per release: keep the count from growing)
        slot = self.ids[self.written % len(self.ids)]
        arrays, extras = split_batch(batch)
        fields = self.ring.write(slot, arrays)
        if fields is None:  # larger than the slot (another shape): send it whole
            self.conn.send(("data", gen, b, batch))
            return
        self.written += 1
        same = fields is self.sent_fields or fields == self.sent_fields
        self.sent_fields = fields
        self.conn.send(("slot", gen, b, slot, None if same else fields, extras))


def _watch_parent(worker: _Worker, parent_pid: int) -> None:
    """Exit (unlinking the ring) as soon as the training process is gone (a daemon thread)."""
    while True:
        time.sleep(POLL_S)
        if os.getppid() != parent_pid:
            if worker.ring is not None:
                unlink(worker.ring.name)
            os._exit(0)


def worker_main(
    source: bytes,
    w: int,
    n: int,
    conn: Any,
    parent_pid: int,
    released: Any = None,
    wake: Any = None,
    claim: Any = None,
) -> None:
    """Entry point of worker ``w`` of ``n`` (importable: 'spawn' and 'forkserver' run it).

    ``source`` comes pickled whatever the start method: a forked worker must not use the
    readers the training process opened (file offsets and handles are shared across a fork),
    so it unpickles the description and opens its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    worker = _Worker(pickle.loads(source), w, n, conn, parent_pid, released, wake, claim)
    threading.Thread(target=_watch_parent, args=(worker, parent_pid), daemon=True).start()
    try:
        worker.run()
    except (BrokenPipeError, ConnectionResetError, EOFError):
        pass
    finally:
        if worker.ring is not None:
            worker.ring.close()
            if os.getppid() != parent_pid:  # the training process died: nobody else will
                unlink(worker.ring.name)


class _Resources:
    """What a pool owns; ``shutdown`` is safe to call twice (finalizer, close, atexit)."""

    def __init__(self) -> None:
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.relays: list[StderrRelay] = []
        self.wakes: list[Any] = []
        self.ring: Ring | None = None

    def shutdown(self) -> None:
        for c, wake in zip(self.conns, self.wakes):
            try:
                c.send(("stop",))
                c.close()
                wake.release()
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + STOP_S
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for relay in self.relays:
            relay.stop()
        self.procs, self.conns, self.relays = [], [], []
        if self.ring is not None:
            self.ring.close()
            self.ring = None


class WorkerPool:
    """``num_workers`` processes over one source, read back in batch order (see module doc)."""

    def __init__(
        self,
        source: BatchSource,
        num_workers: int,
        prefetch: int = 2,
        rank: int = 0,
        ring_mb: float | None = None,
        start_method: str | None = None,
    ):
        self.source, self.n, self.prefetch = source, int(num_workers), max(int(prefetch), 1)
        self.rank, self.ring_mb = int(rank), ring_mb
        self.res = _Resources()
        self._finalizer = weakref.finalize(self, self.res.shutdown)
        remove_stale_segments()
        self.start_method = choose_start_method(start_method)
        ctx = mp.get_context(self.start_method)
        payload = pickle.dumps(source)
        # batches of each worker released (shared; only this process writes it)
        self.released = ctx.RawArray(ctypes.c_int64, self.n)
        # shared out (see the module docstring): [generation, next batch] under a lock
        self.claim = (ctx.Lock(), ctx.RawArray(ctypes.c_int64, 2)) if source.any_worker else None
        self.got: dict[int, tuple] = {}  # batches that came before their turn (shared out)
        for w in range(self.n):
            mine, theirs = ctx.Pipe(duplex=True)
            wake = ctx.Semaphore(0)
            self.res.wakes.append(wake)
            p = ctx.Process(
                target=worker_main,
                args=(payload, w, self.n, theirs, os.getpid(), self.released, wake, self.claim),
                daemon=True,
                name=f"episodekit-loader-{w}",
            )
            self.res.relays.append(StderrRelay.start(p))
            theirs.close()
            self.res.procs.append(p)
            self.res.conns.append(mine)
        for relay in self.res.relays:  # (threads only once every worker is started: fork)
            relay.run_in_thread()
        self.gen = 0
        self.held: int | None = None  # the worker whose slot the last batch views
        self.fields: list[Any] = [None] * self.n  # each worker's last layout

    @property
    def pids(self) -> list[int]:
        return [int(p.pid) for p in self.res.procs]

    @property
    def ring(self) -> Ring | None:
        return self.res.ring

    def start(self, state: Mapping[str, Any], n: int) -> None:
        """Every worker starts making the batches of the epoch that begins at ``state``."""
        self.gen += 1
        self.held = None
        self.got.clear()
        if self.claim is not None:
            lock, counter = self.claim
            with lock:
                counter[0], counter[1] = self.gen, 0
        for w, c in enumerate(self.res.conns):
            c.send(("start", self.gen, state, int(n), int(self.released[w])))
            self.res.wakes[w].release()

    def get(self, b: int) -> dict[str, Any]:
        """Batch ``b`` of the current epoch (releases the previous one's slot)."""
        if self.held is not None:
            w, self.held = self.held, None
            self.released[w] += 1
            self.res.wakes[w].release()
        w, msg, fields = self._shared(b) if self.claim is not None else self._next_of(b % self.n)
        kind = msg[0]
        if kind == "error":
            where = "starting the epoch" if msg[2] < 0 else f"batch {msg[2]}"
            err = WorkerError(f"loader worker {w} failed on {where}: {msg[3]}")
            err.add_note(f"worker traceback:\n{msg[4]}")
            raise err
        if msg[2] != b:  # pragma: no cover - a protocol bug, never data
            raise WorkerError(f"loader worker {w} sent batch {msg[2]}, expected {b}")
        if kind == "data":
            batch = msg[3]
            if self.res.ring is None:
                self._make_ring(batch)
            return batch
        slot, extras = msg[3], msg[5]
        self.held = w
        return self.res.ring.read(slot, fields, extras)

    def _next_of(self, w: int) -> tuple[int, tuple, Any]:
        """(w, worker ``w``'s next message of this epoch, the layout it goes with)."""
        while True:
            msg = self._recv(w)
            if msg[0] == "slot" and msg[4] is not None:
                self.fields[w] = msg[4]
            if msg[1] == self.gen:
                return w, msg, self.fields[w]

    def _shared(self, b: int) -> tuple[int, tuple, Any]:
        """(worker, message, layout) of batch ``b`` when batches are shared out: messages of
        other batches are kept for their turn (each worker's slots are still released in its
        own order: its batches are consumed in increasing order, as it took them)."""
        conns = self.res.conns
        while b not in self.got:
            # a message waiting (the usual case with workers ahead): no selector to build
            ready = [c for c in conns if c.poll()] or mp_connection.wait(conns)
            for c in ready:
                w = conns.index(c)
                msg = self._recv(w)  # (one message: the others may have the batch asked for)
                if msg[0] == "slot" and msg[4] is not None:
                    self.fields[w] = msg[4]
                if msg[1] != self.gen:
                    continue
                if msg[0] == "error":
                    return w, msg, None
                if msg[0] == "data" and self.res.ring is None:
                    self._make_ring(msg[3])
                self.got[msg[2]] = (w, msg, self.fields[w])
        return self.got.pop(b)

    def check_alive(self) -> None:
        """Raise :class:`WorkerError` for a worker that died: with batches shared out, the
        others may have made every batch it would have (nothing lost, but the pool is broken)."""
        for w, proc in enumerate(self.res.procs):
            if not proc.is_alive():
                proc.join(1.0)
                raise WorkerError(died(w, proc, self.res.relays[w], self.start_method))

    def _recv(self, w: int) -> tuple:
        """Worker ``w``'s next message; a dead worker's pipe end is closed by the kernel, so a
        blocking read ends with EOF (no polling on the hot path)."""
        conn, proc = self.res.conns[w], self.res.procs[w]
        try:
            return conn.recv()
        except (EOFError, OSError):
            pass
        proc.join(1.0)
        raise WorkerError(died(w, proc, self.res.relays[w], self.start_method))

    def _make_ring(self, batch: Mapping[str, Any]) -> None:
        arrays, _ = split_batch(batch)
        slot_bytes = slot_bytes_for(arrays, self.source.max_rows())
        slots = self.n * self.prefetch
        ring = Ring.create(slot_bytes, slots, self.rank, self.ring_mb)
        self.res.ring = ring
        for w, c in enumerate(self.res.conns):
            ids = list(range(w * self.prefetch, (w + 1) * self.prefetch))
            c.send(("slots", ring.name, ring.slot_bytes, slots, ids))
            self.res.wakes[w].release()

    def close(self) -> None:
        self._finalizer()


class BatchLoader:
    """Batches of a source, epoch by epoch, in-process or from worker processes (same batches,
    same order). ``convert`` is applied to each batch (``make_loader``: to torch tensors).

    ``state_dict()`` is the source's own resume state after the batches handed out so far;
    ``load_state_dict`` resumes at the exact batch; ``set_epoch`` starts an epoch from its
    beginning (a no-op when already in it). Iterating again mid-epoch continues where it was.
    """

    def __init__(
        self,
        source: BatchSource,
        num_workers: int = 0,
        prefetch: int = 2,
        rank: int = 0,
        ring_mb: float | None = None,
        start_method: str | None = None,
        convert: Callable[[dict[str, Any]], Any] | None = None,
    ):
        if int(num_workers) < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if int(prefetch) < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        self.source, self.num_workers = source, int(num_workers)
        self.prefetch, self.rank, self.ring_mb = int(prefetch), int(rank), ring_mb
        self.start_method = start_method
        self.convert = convert or (lambda x: x)
        self.pool: WorkerPool | None = None
        self.closed = False
        source.open()
        self._begin(source.epoch_state(0))

    def _begin(self, state: Any) -> None:
        self._n = self.source.begin(state)
        self._consumed = 0
        self._state0 = self.source.state(0)
        self.epoch = self.source.epoch_of(self._state0)

    def __len__(self) -> int:
        """Batches left in the current run of the epoch (all of them at its start)."""
        return self._n - self._consumed

    def state_dict(self) -> dict[str, Any]:
        """The resume state after the batches handed out so far."""
        return self.source.state(self._consumed)

    def load_state_dict(self, state: Any) -> None:
        """Continue exactly after the batches ``state`` counts (before iterating)."""
        self._begin(state)

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.epoch:
            self._begin(self.source.epoch_state(int(epoch)))

    def __iter__(self) -> Iterator[Any]:
        if self.closed:
            raise ValueError("this loader is closed")
        if self._n and self._consumed >= self._n:
            self._begin(self.source.epoch_state(self.epoch + 1))
        elif self._consumed:
            self._begin(self.source.state(self._consumed))
        n = self._n
        if not self.num_workers:
            for b in range(n):
                batch = self.source.batch(b)
                self._consumed += 1
                yield self.convert(batch)
            return
        if self.pool is None:
            self.pool = WorkerPool(
                self.source,
                self.num_workers,
                self.prefetch,
                self.rank,
                self.ring_mb,
                self.start_method,
            )
        pool = self.pool
        pool.start(self._state0, n)
        gen = pool.gen
        for b in range(n):
            try:
                batch = pool.get(b)
            except BaseException:
                self.close()
                raise
            self._consumed += 1
            yield self.convert(batch)
            if pool.gen != gen:  # iterated again or reloaded meanwhile
                return
        try:  # a worker that died holding no batch: said now, not at the next epoch's start
            pool.check_alive()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the workers and free the ring (safe to call again)."""
        self.closed = True
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def __enter__(self) -> BatchLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
