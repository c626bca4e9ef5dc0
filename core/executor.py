"""Run independent per-file jobs locally (a process pool) or as Ray tasks, results in input order.

The row-group rewrite and the per-file validation scans both use this: files are independent, and
one process per file is how parquet work parallelizes (pyarrow's writer is single-threaded).
``executor="ray"`` uses an existing cluster (``ray.init(address="auto")``) when there is one, else
starts a local instance; ray is an optional extra (``episodekit[ray]``).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

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
        raise RuntimeError("executor 'ray' needs ray: pip install 'episodekit[ray]'") from exc
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
) -> Iterator[tuple[int, R]]:
    """Yield ``(position, fn(item))`` as jobs finish (any order). ``fn`` must be picklable.

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
    if executor == "ray":
        ray = _init_ray(workers)
        remote = ray.remote(fn)
        refs = {remote.remote(item): i for i, item in enumerate(items)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield refs[ref], ray.get(ref)
        return
    if workers == 1 or len(items) == 1:
        for i, item in enumerate(items):
            yield i, fn(item)
        return
    # "spawn": forking a process that already runs duckdb's or pyarrow's threads can deadlock.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=ctx) as pool:
        futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
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
