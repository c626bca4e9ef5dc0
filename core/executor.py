"""Run independent per-file jobs locally (a process pool) or as Ray tasks, results in input order.

Every per-file step uses this (row-group rewrite, validation scans, stats passes, frame-store
columns, video re-encodes): files are independent, and one process per file is how parquet work
parallelizes (pyarrow's writer is single-threaded). ``executor="ray"`` connects to the cluster at
``$RAY_ADDRESS`` (the CLI's ``--ray-address``; ``ray://host:10001`` or ``host:6379``) when set,
else to the cluster ``ray start`` recorded on this machine, else starts a local instance of its
own (never another command's: it ends with that command); ray is an optional extra
(``episodekit[ray]``). A Ray task whose node dies is retried elsewhere (``RAY_MAX_RETRIES``
times); every per-file job writes atomically, so a retried job starts over on
a clean slate and nothing half-written is published.

What a job returns travels back to the driver: return small summaries (counts, per-episode
rows), never a table of frames, so the driver holds O(files + episodes) whatever the frames.
Data every job needs (an episodes table) goes in ``shared``: put in Ray's object store once,
not pickled into every task.

A pool is started (and a progress bar opened) only when there is work for it: ``quick(item)``
(optional) is tried in this process first and may answer an item without a worker (e.g. a file
whose footer says it is done), so a rerun where everything is fresh never pays the seconds a spawn
pool costs, nor draws a bar. Every call reports
finished items to the current progress reporter (:mod:`episodekit.core.progress`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from episodekit.core import interrupt, lifeline
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.memory import release_memory
from episodekit.core.progress import current

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("local", "ray")
RAY_ADDRESS_ENV = "RAY_ADDRESS"
RAY_MAX_RETRIES = 3  # a task on a node that died runs again elsewhere (jobs are idempotent)
RAYLET_PID_ENV = "RAY_RAYLET_PID"  # set by Ray in its workers (the raylet is their parent)
STOP_S = 3.0  # how long stopped pool workers get to unwind before they are killed
UNSTICK_S = 0.5  # how long a stopped pool's manager thread gets to end by itself


def default_workers() -> int:
    """Number of usable cores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _init_ray(num_cpus: int | None):
    try:
        import ray  # noqa: PLC0415 - optional dependency
    except ImportError as exc:
        raise EnvironmentProblem(
            "--executor ray needs ray, which is not installed: pip install 'episodekit[ray]'"
        ) from exc
    if ray.is_initialized():
        return ray
    try:
        _connect_ray(ray, num_cpus)
    finally:
        interrupt.reinstall()  # ray.init makes SIGTERM a plain sys.exit: ours again (exit 143)
    return ray


def _connect_ray(ray: Any, num_cpus: int | None) -> None:
    address = os.environ.get(RAY_ADDRESS_ENV)
    if address:
        try:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            interrupt.check()
            raise EnvironmentProblem(
                f"cannot connect to the Ray cluster at {address} ({exc}); check --ray-address "
                f"(or ${RAY_ADDRESS_ENV})"
            ) from exc
        return
    recorded = _recorded_cluster()
    if recorded:
        try:
            ray.init(address=recorded, ignore_reinit_error=True, log_to_driver=False)
            return
        except (ConnectionError, RuntimeError, ValueError):
            interrupt.check()  # a stale record (the cluster is gone): an instance of our own
    # "local": a new instance of our own, even if another process started one meanwhile (Ray
    # refuses num_cpus for "an existing cluster": seen when two commands started at once)
    ray.init(
        address="local",
        num_cpus=num_cpus,
        ignore_reinit_error=True,
        log_to_driver=False,
        include_dashboard=False,
    )


def _recorded_cluster() -> str | None:
    """The address of the cluster ``ray start`` recorded on this machine (read as ``ray.init()``
    reads it), or None. Not ``address="auto"``: that also joins any Ray it finds running, such
    as the local instance another ``--executor ray`` command started for itself, which ends
    with that command (a second command then failed: "The task's local raylet died")."""
    try:
        from ray._private.utils import read_ray_address
    except ImportError:  # a Ray that moved it: no recorded cluster, an instance of our own
        return None
    return read_ray_address() or None


def _call(fn: Callable, item: Any, *shared: Any) -> Any:
    """``fn(item)``, or ``fn(item, shared)`` when the call has shared data."""
    return fn(item, *shared)


def _call_task(fn: Callable, item: Any, *shared: Any) -> Any:
    """:func:`_call` in a Ray worker, which runs task after task: what the task freed goes back
    to the system afterwards (arrow's pool, the C heap), so a worker's RSS stays at one task's
    rather than the high-water mark of every task it ran. The worker dies with its raylet
    (its parent), which dies with a driver that started a local instance (``kill -9``
    included): no task of a dead command goes on writing."""
    raylet = int(os.environ.get(RAYLET_PID_ENV) or 0)
    if raylet and os.getppid() in (raylet, 1):  # (1: orphaned already; as Ray's own watcher)
        lifeline.die_with_parent(raylet)
    try:
        return fn(item, *shared)
    finally:
        release_memory()


_NONE = object()  # no shared data (None is a value)


def _extra(shared: Any) -> tuple:
    return () if shared is _NONE else (shared,)


def imap_files(
    fn: Callable[[T], R],
    items: Iterable[T],
    executor: str = "local",
    workers: int | None = None,
    quick: Callable[[T], R | None] | None = None,
    shared: Any = _NONE,
) -> Iterator[tuple[int, R]]:
    """Yield ``(position, fn(item))`` as jobs finish (any order). ``fn`` must be picklable.

    ``shared``, when given, is passed to every call as ``fn(item, shared)``: with Ray it is put
    in the object store once (each node fetches it once), locally it is pickled per job.

    ``quick(item)``, when given, runs first in this process for every item; a non-None answer is
    that item's result and no worker sees it (a pool starts only if some item is left).
    ``workers=1`` with the local executor runs in this process (no pool; easy to debug).
    Exceptions raised by ``fn`` propagate; callers that want per-file error reports should catch
    inside ``fn`` and return the error as a value.
    """
    items = list(items)
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    workers = workers or default_workers()
    if not items:
        return
    todo = []
    for i, item in enumerate(items):
        answer = quick(item) if quick is not None else None
        if answer is None:
            todo.append(i)
            continue
        yield i, answer
    if not todo:
        return  # nothing ran: no progress bar for a no-op (e.g. a rerun with every file done)
    with current().task(len(items)) as task:  # drawn once real work starts
        task.advance(len(items) - len(todo))
        for i, r in _run(fn, [(i, items[i]) for i in todo], executor, workers, shared):
            task.advance()
            yield i, r
            del r  # not held while the next job is awaited (see _run_ray)


def _run(
    fn: Callable[[T], R], jobs: list[tuple[int, T]], executor: str, workers: int, shared: Any
) -> Iterator[tuple[int, R]]:
    if not jobs:
        return
    if executor == "ray":
        yield from _run_ray(fn, jobs, workers, shared)
        return
    if workers == 1 or len(jobs) == 1:
        for i, item in jobs:
            yield i, _call(fn, item, *_extra(shared))
        return
    yield from _run_pool(fn, jobs, workers, shared)


def _spawn_pool(workers: int) -> Any:
    """A process pool of ``workers`` whose workers die with this process (:mod:`lifeline`)."""
    # Imported here: the CLI imports this module for EXECUTORS and must start fast.
    import multiprocessing  # noqa: PLC0415
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

    # "spawn": forking a process that already runs duckdb's or pyarrow's threads can deadlock.
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=lifeline.follow,
        initargs=(os.getpid(),),
    )


def _run_pool(
    fn: Callable[[T], R], jobs: list[tuple[int, T]], workers: int, shared: Any
) -> Iterator[tuple[int, R]]:
    """The jobs in a 'spawn' process pool whose workers die with this process; stopped (not
    drained) when the caller stops early, an interrupt arrives, or a job raises."""
    from concurrent.futures import as_completed  # noqa: PLC0415

    pool = _spawn_pool(min(workers, len(jobs)))
    try:
        with interrupt.deferred():  # submit starts the workers: not cut half-way
            futures = {pool.submit(_call_job, fn, item, *_extra(shared)): i for i, item in jobs}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
        pool.shutdown(wait=True)
    except BaseException:  # an interrupt, a job's error, or the caller closed the generator
        _stop(pool)
        raise


def _call_job(fn: Callable, item: Any, *shared: Any) -> Any:
    """:func:`_call` in a pool worker (SIGTERM interrupts the job, then ends the worker)."""
    with lifeline.job():
        return fn(item, *shared)


def _stop(pool: Any) -> None:
    """Stop ``pool`` now: pending jobs cancelled, running ones interrupted (SIGTERM: each job
    unwinds and removes its temporaries), any worker still alive after ``STOP_S`` killed. Every
    write is atomic, so a stopped job leaves its target as it was."""
    # The executor has no public handle on its processes; ``_processes`` (pid -> Process) has
    # been there since Python 3.2. Taken before shutdown, which forgets it.
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    results = getattr(pool, "_result_queue", None)
    pool.shutdown(wait=False, cancel_futures=True)
    from multiprocessing.connection import wait  # noqa: PLC0415

    alive = {}
    for p in procs:
        with contextlib.suppress(OSError, ValueError):
            p.terminate()
            alive[p.sentinel] = p  # ready once the process is gone (whoever reaps it)
    deadline = time.monotonic() + STOP_S
    while alive and time.monotonic() < deadline:
        for ready in wait(list(alive), timeout=max(0.0, deadline - time.monotonic())):
            alive.pop(ready)
    for p in alive.values():
        with contextlib.suppress(OSError, ValueError):
            p.kill()
    if alive:
        wait(list(alive), timeout=STOP_S)  # SIGKILL is not instant
    _unstick(manager, results)


def _unstick(manager: Any, results: Any) -> None:
    """Let the pool's manager thread end once every worker is gone. A worker stopped while it
    sent a result leaves half a message in the result pipe; the thread then waits in ``recv``
    for the rest forever, and the interpreter, which joins it at exit, never exits (CPython
    issue; seen as a hang after Ctrl-C). Closing our copy of the pipe's write end (the workers'
    copies died with them) turns that wait into end-of-file: the thread sees a broken pool and
    ends."""
    if manager is None or results is None:
        return
    manager.join(timeout=UNSTICK_S)
    if manager.is_alive():
        with contextlib.suppress(OSError, AttributeError):
            results._writer.close()
        manager.join(timeout=STOP_S)


def _run_ray(
    fn: Callable[[T], R], jobs: list[tuple[int, T]], workers: int, shared: Any
) -> Iterator[tuple[int, R]]:
    """One Ray task per job (retried on another node when its node dies); results as they come.
    Stopped early (an interrupt, a task's error, the caller closing the generator), the tasks
    not finished are cancelled: each running one is interrupted where it is (its atomic writes
    remove their temporaries), one still running after ``STOP_S`` has its worker killed."""
    ray = _init_ray(workers)
    remote = ray.remote(max_retries=RAY_MAX_RETRIES, retry_exceptions=False)(_call_task)
    extra = tuple(ray.put(x) for x in _extra(shared))  # once, not pickled into every task
    refs = {remote.remote(fn, item, *extra): i for i, item in jobs}
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ref = done.pop()
            # Neither the ref nor the value is held here once handed over: a result stays in
            # the object store while anything refers to it (its ref, or arrays viewing its
            # buffer), and a result kept while the next one is awaited makes the store place
            # that one elsewhere. The driver maps every store page it reads, so results alive
            # together add up in its RSS; consumed one at a time, they reuse the same pages.
            yield refs.pop(ref), ray.get(ref)
            del ref
    except BaseException:
        _cancel_ray(ray, list(refs))
        raise


def _cancel_ray(ray: Any, refs: list) -> None:
    """Cancel ``refs``: interrupt first (KeyboardInterrupt in the task), then kill the workers
    of those still running after ``STOP_S``."""
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=False)
    with contextlib.suppress(Exception):
        _, refs = ray.wait(refs, num_returns=len(refs), timeout=STOP_S)
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)


def imap_ordered(
    fn: Callable[[T], R],
    items: Iterable[T],
    executor: str = "local",
    workers: int = 1,
    ahead: int | None = None,
    shared: Any = _NONE,
) -> Iterator[R]:
    """Yield ``fn(item)`` (``fn(item, shared)`` with ``shared``) in input order, for a consumer
    that must take results in order (``import``'s episode sink). At most ``ahead`` (default
    ``2 * workers``) jobs are submitted and not yet consumed: memory holds a bounded window of
    results, whatever the number of items. ``items`` may be a lazy iterable.

    ``executor="local"``: in this process when ``workers`` is 1, else a 'spawn' pool of
    ``workers`` processes that die with this one; ``"ray"``: one Ray task per item on the
    cluster :func:`imap_files` would use (``shared`` put in the object store once), its
    ``workers`` the CPUs of a local instance it starts. Stopped early (an interrupt, a job's
    error, the caller closing the generator), the jobs not consumed are stopped or cancelled.
    A job's exception is raised as it was raised (a Ray task's: its cause, not Ray's wrapper)."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    workers = max(1, int(workers))
    ahead = max(1, ahead or 2 * workers)
    extra = _extra(shared)
    if executor == "ray":
        yield from _ordered_ray(fn, items, workers, ahead, extra)
        return
    if workers == 1:
        for item in items:
            yield _call(fn, item, *extra)
        return
    from collections import deque  # noqa: PLC0415

    pool = _spawn_pool(workers)

    def submit(item: Any) -> Any:
        with interrupt.deferred():  # submit may start a worker: not cut half-way
            return pool.submit(_call_job, fn, item, *extra)

    try:
        yield from _in_order(items, ahead, submit, lambda fut: fut.result(), deque())
        pool.shutdown(wait=True)
    except BaseException:
        _stop(pool)
        raise


def _ordered_ray(
    fn: Callable[[T], R], items: Iterable[T], workers: int, ahead: int, extra: tuple
) -> Iterator[R]:
    """:func:`imap_ordered` on Ray: a window of ``ahead`` tasks, taken in order."""
    from collections import deque  # noqa: PLC0415

    ray = _init_ray(workers)
    remote = ray.remote(max_retries=RAY_MAX_RETRIES, retry_exceptions=False)(_call_task)
    extra = tuple(ray.put(x) for x in extra)  # once, not pickled into every task
    pending: deque = deque()
    try:

        def submit(item: Any) -> Any:
            return remote.remote(fn, item, *extra)

        yield from _in_order(items, ahead, submit, lambda ref: _get_ray(ray, ref), pending)
    except BaseException:
        _cancel_ray(ray, list(pending))
        raise


def _in_order(
    items: Iterable[Any], ahead: int, submit: Callable, get: Callable, pending: Any
) -> Iterator[Any]:
    """``ahead`` jobs submitted, then each result taken in order, the next job submitted before
    it is handed over (so ``ahead`` run while the consumer works); ``pending`` (a deque) holds
    the jobs submitted and not taken, for the caller to stop on an error."""
    todo = iter(items)
    for item in todo:
        pending.append(submit(item))
        if len(pending) >= ahead:
            break
    while pending:
        result = get(pending.popleft())
        for item in todo:  # the next one, if any
            pending.append(submit(item))
            break
        yield result
        del result  # not held while the next one is awaited


def _get_ray(ray: Any, ref: Any) -> Any:
    """``ray.get(ref)``; a task's exception raised as itself (its cause), so that it reads and
    is classified as the same exception raised by a local job."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            raise cause from None
        raise


def imap_threads(fn: Callable[[T], R], items: Iterable[T], threads: int) -> Iterator[tuple[int, R]]:
    """Yield ``(position, fn(item))`` as ``threads`` threads finish them (any order). Stopped
    early (an interrupt, an error, the caller closing the generator), the items not started are
    cancelled and only the running ones are waited for (a thread cannot be stopped; a long ``fn``
    calls :func:`episodekit.core.interrupt.check` between steps to end sooner)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed  # noqa: PLC0415

    with ThreadPoolExecutor(threads) as pool:
        futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
        try:
            for fut in as_completed(list(futures)):  # a consumed future is dropped, with its result
                yield futures.pop(fut), fut.result()
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def map_files(
    fn: Callable[[T], R],
    items: Iterable[T],
    executor: str = "local",
    workers: int | None = None,
    shared: Any = _NONE,
) -> list[R]:
    """``[fn(item) for item in items]`` (``fn(item, shared)`` with ``shared``) run in parallel;
    results in input order."""
    items = list(items)
    out: list[Any] = [None] * len(items)
    for i, r in imap_files(fn, items, executor, workers, shared=shared):
        out[i] = r
    return out
