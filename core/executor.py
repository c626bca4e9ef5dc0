"""Run independent per-file jobs locally (a process pool) or as Ray tasks, results in input order.

The row-group rewrite and the per-file validation scans both use this: files are independent, and
one process per file is how parquet work parallelizes (pyarrow's writer is single-threaded).
``executor="ray"`` uses an existing cluster (``ray.init(address="auto")``) when there is one, else
starts a local instance; ray is an optional extra (``episodekit[ray]``).

A pool is started (and a progress bar opened) only when there is work for it: ``quick(item)``
(optional) is tried in this process first and may answer an item without a worker (e.g. a file
whose footer says it is done), so a rerun where everything is fresh never pays the seconds a spawn
pool costs, nor draws a bar. Every call reports
finished items to the current progress reporter (:mod:`episodekit.core.progress`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from episodekit.core.errors import EnvironmentProblem
from episodekit.core.progress import current

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("local", "ray")


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
    if not ray.is_initialized():
        try:
            ray.init(address="auto", ignore_reinit_error=True, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError):
            ray.init(
                num_cpus=num_cpus,
                ignore_reinit_error=True,
                log_to_driver=False,
                include_dashboard=False,
            )
    return ray


def imap_files(
    fn: Callable[[T], R],
    items: Iterable[T],
    executor: str = "local",
    workers: int | None = None,
    quick: Callable[[T], R | None] | None = None,
) -> Iterator[tuple[int, R]]:
    """Yield ``(position, fn(item))`` as jobs finish (any order). ``fn`` must be picklable.

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
        for i, r in _run(fn, [(i, items[i]) for i in todo], executor, workers):
            task.advance()
            yield i, r


def _run(
    fn: Callable[[T], R], jobs: list[tuple[int, T]], executor: str, workers: int
) -> Iterator[tuple[int, R]]:
    if not jobs:
        return
    if executor == "ray":
        ray = _init_ray(workers)
        remote = ray.remote(fn)
        refs = {remote.remote(item): i for i, item in jobs}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield refs[ref], ray.get(ref)
        return
    if workers == 1 or len(jobs) == 1:
        for i, item in jobs:
            yield i, fn(item)
        return
    # Imported here: the CLI imports this module for EXECUTORS and must start fast.
    import multiprocessing  # noqa: PLC0415
    from concurrent.futures import ProcessPoolExecutor, as_completed  # noqa: PLC0415

    # "spawn": forking a process that already runs duckdb's or pyarrow's threads can deadlock.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
        futures = {pool.submit(fn, item): i for i, item in jobs}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()


def map_files(
    fn: Callable[[T], R], items: Iterable[T], executor: str = "local", workers: int | None = None
) -> list[R]:
    """``[fn(item) for item in items]`` run in parallel; results in input order."""
    items = list(items)
    out: list[Any] = [None] * len(items)
    for i, r in imap_files(fn, items, executor, workers):
        out[i] = r
    return out
