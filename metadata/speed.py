"""Per-task speed percentiles: decile boundaries of episode length, and each episode's speed bucket.

A policy conditioned on "speed" should see "a fast/slow example of *this* task", not an absolute
duration. So each task gets ten boundaries (the 5th, 15th, ..., 95th percentile of its episode
lengths in frames, numpy's default linear interpolation) and an episode is bucketed against its own
task: ``searchsorted(boundaries, length, side="right") * 10`` gives a label in {0, 10, ..., 100}
(a tie on a boundary goes to the upper bucket). A task with fewer than 10 distinct lengths is
sparse (``percentiles`` null) and its episodes, like those of tasks missing from the file or with
no resolvable task, get 50.

The table is persisted once per dataset as ``meta/speed_percentiles.jsonl``, one row per task
sorted by task_index: ``task_index, task, n_episodes, percentiles, version, fingerprint``.
Writes are atomic (unique temporary + ``os.replace``) and rank-gated (only the global main process
writes); a read-only or remote root gets the in-memory result and one warning.
"""

from __future__ import annotations

import errno
import io
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import jsonlines
import numpy as np

from episodekit.core.atomic import atomic_write_text
from episodekit.core.dataset import Dataset, DatasetError, as_dataset, is_local
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.logs import log_once
from episodekit.core.paths import SPEED_FILE
from episodekit.core.words import plural
from episodekit.core.world import RankInfo, barrier, rank_info
from episodekit.metadata.artifact import (
    MAX_ARTIFACT_BYTES,
    artifact_path,
    local_target,
    locate,
    read_bytes,
)

log = logging.getLogger(__name__)

SPEED_VERSION = 1
PERCENTILE_POINTS = tuple(range(5, 100, 10))  # 5, 15, ..., 95: ten boundaries
NUM_BOUNDARIES = len(PERCENTILE_POINTS)
MIN_DISTINCT_LENGTHS = 10  # fewer distinct episode lengths than this: the task is sparse
SPARSE_BUCKET = 50  # bucket of sparse, missing and unresolved tasks
LABEL_STEP = 10  # bucket label = number of boundaries <= length, times 10
REQUIRED_KEYS = ("task_index", "task", "n_episodes", "percentiles")
READ_ONLY_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


class SpeedFileError(DatasetError):
    """``meta/speed_percentiles.jsonl`` exists but is not a valid speed-percentiles file."""


# --------------------------------------------------------------------------------------------
# Computing

SPEED_IN_MEMORY_ENV = "EPISODEKIT_SPEED_IN_MEMORY"  # 1: loaders never write the speed file


def _sort_by_task_then_length(
    task_index: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(task_index, length) pairs sorted by task, then length: one int64 key sort when it fits."""
    if not len(lengths):
        return task_index, lengths
    modulus = int(lengths.max()) + 1
    if lengths.min() >= 0 and int(task_index.max()) < (2**62) // modulus:
        return np.divmod(np.sort(task_index * modulus + lengths), modulus)
    order = np.lexsort((lengths, task_index))
    return task_index[order], lengths[order]


def _task_groups(ds: Dataset, warn: bool = True) -> dict[str, np.ndarray]:
    """Episodes grouped by task_index (unresolved ones dropped, with one warning if ``warn``).

    Returns sorted ``lengths`` (by task, then length), and per present task: ``task_index``,
    ``start``, ``count`` and ``distinct`` (number of distinct lengths).
    """
    task_index = ds.column("task_index").astype(np.int64, copy=False)
    lengths = ds.column("length").astype(np.int64, copy=False)
    unresolved = task_index < 0
    if unresolved.any() and warn:
        eps = ds.column("episode_index")[unresolved]
        log.warning(
            "%s: %s no resolvable task (e.g. episode %s); they are skipped by the "
            "speed percentiles and get bucket %d",
            ds.root,
            plural(len(eps), "episode") + (" has" if len(eps) == 1 else " have"),
            eps[:5].tolist(),
            SPARSE_BUCKET,
        )
    task_index, lengths = task_index[~unresolved], lengths[~unresolved]
    t, v = _sort_by_task_then_length(task_index, lengths)
    new_task = np.ones(len(t), dtype=bool)
    new_task[1:] = t[1:] != t[:-1]
    new_value = new_task.copy()
    new_value[1:] |= v[1:] != v[:-1]
    start = np.flatnonzero(new_task)
    count = np.diff(np.append(start, len(t)))
    distinct = np.add.reduceat(new_value, start, dtype=np.int64) if len(start) else count
    tasks = t[start]
    return {"lengths": v, "task_index": tasks, "start": start, "count": count, "distinct": distinct}


def _boundaries(g: dict[str, np.ndarray]) -> np.ndarray:
    """Percentile boundaries (tasks x 10) of the grouped lengths; NaN rows for sparse tasks.

    Tasks with the same episode count are stacked into one matrix and go through one
    ``np.percentile(..., axis=1)`` call: numpy's own arithmetic, without a call per task.
    """
    out = np.full((len(g["task_index"]), NUM_BOUNDARIES), np.nan)
    dense = np.flatnonzero(g["distinct"] >= MIN_DISTINCT_LENGTHS)
    for n in np.unique(g["count"][dense]):
        tasks = dense[g["count"][dense] == n]
        matrix = g["lengths"][g["start"][tasks][:, None] + np.arange(n)]
        out[tasks] = np.percentile(matrix, PERCENTILE_POINTS, axis=1).T
    return out


def compute_speed_rows(ds: Dataset) -> list[dict]:
    """One row per task of ``ds.tasks`` (sorted by task_index), as stored in the file.

    ``percentiles`` are the 5th..95th percentile (step 10) of the task's episode lengths, or None
    when the task has fewer than 10 distinct lengths (including tasks without episodes).
    """
    g = _task_groups(ds)
    where = dict(zip(g["task_index"].tolist(), range(len(g["task_index"]))))
    counts = g["count"].tolist()
    boundaries = _boundaries(g)
    dense = ~np.isnan(boundaries[:, 0])
    fingerprint = ds.fingerprint
    rows = []
    for task_index, task in zip(ds.tasks.column("task_index").to_pylist(), ds.task_strings()):
        k = where.get(task_index)
        rows.append(
            {
                "task_index": int(task_index),
                "task": task,
                "n_episodes": counts[k] if k is not None else 0,
                "percentiles": boundaries[k].tolist() if k is not None and dense[k] else None,
                "version": SPEED_VERSION,
                "fingerprint": fingerprint,
            }
        )
    rows.sort(key=lambda r: r["task_index"])
    return rows


# --------------------------------------------------------------------------------------------
# Bucketing


def bucket(length: int, boundaries: Sequence[float] | None) -> int:
    """Speed bucket (0, 10, ..., 100) of one episode against its task's boundaries (None -> 50)."""
    if boundaries is None:
        return SPARSE_BUCKET
    b = np.asarray(boundaries, dtype=np.float64)
    return int(np.searchsorted(b, length, side="right")) * LABEL_STEP


def _row_of(task_index: np.ndarray, row_task: np.ndarray) -> np.ndarray:
    """Position in ``row_task`` (sorted, unique) of each task_index, -1 when absent."""
    hi = int(task_index.max()) if len(task_index) else -1
    if hi < 0:
        return np.full(len(task_index), -1, dtype=np.int64)
    if hi <= 4 * len(task_index) + 65536:  # task indices are small: a lookup table
        table = np.full(hi + 2, -1, dtype=np.int64)  # the last slot answers task_index -1
        keep = row_task <= hi
        table[row_task[keep]] = np.flatnonzero(keep)
        return table[np.where(task_index >= 0, task_index, hi + 1)]
    pos = np.minimum(np.searchsorted(row_task, task_index), len(row_task) - 1)
    return np.where(row_task[pos] == task_index, pos, -1)


def buckets_for(
    task_index: np.ndarray, lengths: np.ndarray, rows: Sequence[dict] | None
) -> np.ndarray:
    """Vectorized :func:`bucket` for many episodes given their task_index and length.

    The bucket is the number of boundaries ``<= length`` (what ``searchsorted(side="right")``
    returns for ascending boundaries) times 10: ten vectorized passes, one per boundary column,
    each comparing every episode with its own task's boundary.
    """
    task_index = np.asarray(task_index, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.full(len(lengths), SPARSE_BUCKET, dtype=np.int64)
    dense = [r for r in rows or () if r.get("percentiles") is not None]
    if not dense or not len(lengths):
        return out
    row_task = np.array([r["task_index"] for r in dense], dtype=np.int64)
    bounds = np.array([r["percentiles"] for r in dense], dtype=np.float64).reshape(len(dense), -1)
    order = np.argsort(row_task, kind="stable")
    row = _row_of(task_index, row_task[order])
    hit = row >= 0
    row, length = row[hit], lengths[hit]
    count = np.zeros(len(row), dtype=np.int64)
    for column in bounds[order].T:
        count += column[row] <= length
    out[hit] = count * LABEL_STEP
    return out


def episode_buckets(ds: Dataset, rows: Sequence[dict] | None) -> np.ndarray:
    """Speed bucket of every episode, in ``ds.episodes`` row order (int64; 50 when unknown)."""
    return buckets_for(ds.column("task_index"), ds.column("length"), rows)


# --------------------------------------------------------------------------------------------
# The file


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_row(row: Any, line: int, where: str) -> None:
    def bad(msg: str) -> SpeedFileError:
        return SpeedFileError(f"line {line}: {msg}", where)

    if not isinstance(row, dict):
        raise bad(f"expected a JSON object, got {type(row).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in row]
    if missing:
        raise bad(f"missing keys {missing}")
    if "version" in row and row["version"] != SPEED_VERSION:
        raise bad(f"unsupported version {row['version']!r} (this reader knows {SPEED_VERSION})")
    if not _is_int(row["task_index"]) or row["task_index"] < 0:
        raise bad(f"task_index must be a non-negative integer, got {row['task_index']!r}")
    if not _is_int(row["n_episodes"]) or row["n_episodes"] < 0:
        raise bad(f"n_episodes must be a non-negative integer, got {row['n_episodes']!r}")
    p = row["percentiles"]
    if p is None:
        return
    if (
        not isinstance(p, list)
        or len(p) != NUM_BOUNDARIES
        or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in p)
        or not all(math.isfinite(x) for x in p)
    ):
        raise bad(f"percentiles must be null or {NUM_BOUNDARIES} finite numbers, got {p!r}")
    if any(b < a for a, b in zip(p, p[1:])):
        raise bad(f"percentiles must be ascending, got {p!r}")


def max_speed_bytes(root_or_ds: Dataset | str | os.PathLike) -> int:
    """The most bytes a speed file of this dataset can take (one row per task: the JSON-escaped
    task string plus a small fixed part), so a huge or hostile file is refused before parsing.
    Without the dataset at hand: the general artifact bound."""
    if not isinstance(root_or_ds, Dataset):
        return MAX_ARTIFACT_BYTES
    tasks = root_or_ds.task_strings()
    longest = max((len(t.encode("utf-8")) for t in tasks if t), default=0)
    return 64 * 1024 + (len(tasks) + 1) * (1024 + 6 * longest)


def read_speed_file(root_or_ds: Dataset | str | os.PathLike) -> list[dict] | None:
    """The rows of ``meta/speed_percentiles.jsonl`` as written (None when the file is absent).

    Raises :class:`SpeedFileError` naming the file and line for a file that is not valid.
    """
    full = artifact_path(root_or_ds, SPEED_FILE)
    raw = read_bytes(root_or_ds, SPEED_FILE, max_speed_bytes(root_or_ds))
    if raw is None:
        return None
    rows: list[dict] = []
    seen: set[int] = set()
    try:
        reader = jsonlines.Reader(io.BytesIO(raw))
        for line, row in enumerate(reader.iter(skip_empty=True), start=1):
            _check_row(row, line, full)
            if row["task_index"] in seen:
                raise SpeedFileError(f"line {line}: task_index {row['task_index']} repeated", full)
            seen.add(row["task_index"])
            rows.append(row)
    except jsonlines.InvalidLineError as exc:
        raise SpeedFileError(f"not valid JSON lines ({exc})", full) from exc
    return rows


def write_speed_file(ds_or_root: Dataset | str | os.PathLike, rows: Sequence[dict]) -> bool:
    """Write ``rows`` atomically to the root's speed file; return whether it was written.

    Only the global main process writes (other ranks return False). A remote or read-only root is
    not written: one warning per root, no exception. Other I/O errors propagate.
    """
    if not rank_info().is_main:
        return False
    fs, path, name = locate(ds_or_root)
    if not is_local(fs):
        log_once(
            log,
            ("speed", "readonly", name),
            f"{name}: remote root, {SPEED_FILE} kept in memory only",
        )
        return False
    buf = io.StringIO()
    with jsonlines.Writer(buf, compact=True) as writer:
        writer.write_all(rows)
    try:
        atomic_write_text(local_target(ds_or_root, SPEED_FILE), buf.getvalue())
    except (OSError, EnvironmentProblem) as exc:
        if getattr(exc, "errno", None) not in READ_ONLY_ERRNOS:
            raise
        log_once(
            log,
            ("speed", "readonly", name),
            f"{name}: read-only root ({exc}), {SPEED_FILE} not written",
        )
        return False
    return True


def file_fingerprints(rows: Sequence[dict] | None) -> set[str | None]:
    """The distinct fingerprints recorded in a file's rows (None for rows without one)."""
    return {r.get("fingerprint") for r in rows or ()}


def is_fresh(ds: Dataset, rows: Sequence[dict] | None) -> bool:
    """True when every row was computed from exactly ``ds``'s episodes and every task has a row."""
    if rows is None:
        return False
    if file_fingerprints(rows) != {ds.fingerprint}:
        return False
    return set(ds.tasks.column("task_index").to_pylist()) <= {r["task_index"] for r in rows}


# --------------------------------------------------------------------------------------------
# The two paths: batch (CLI / prepare) and runtime (training jobs)


def ensure_speed_rows(
    root: Dataset | str | os.PathLike, force: bool = False
) -> tuple[Dataset, list[dict], str]:
    """Batch path: (dataset, rows, status) where status is "fresh", "written" or "not written".

    The file is recomputed and rewritten when absent, when its fingerprint differs from the
    dataset's, or when ``force``; a fresh file is left alone. A corrupt file raises
    :class:`SpeedFileError` unless ``force``.
    """
    ds = as_dataset(root)
    if not force:
        rows = read_speed_file(ds)
        if is_fresh(ds, rows):
            return ds, rows, "fresh"
    rows = compute_speed_rows(ds)
    wrote = write_speed_file(ds, rows)
    return ds, rows, "written" if wrote else "not written"


def ensure_speed_file(
    root: Dataset | str | os.PathLike, force: bool = False
) -> tuple[list[dict], bool]:
    """Batch path for the CLI and ``prepare``: (rows, whether the file was (re)written)."""
    _, rows, status = ensure_speed_rows(root, force=force)
    return rows, status == "written"


def _episodes_added(ds: Dataset, rows: Sequence[dict]) -> bool:
    """True when some task in the file has more episodes now than the file counted."""
    g = _task_groups(ds, warn=False)
    now = dict(zip(g["task_index"].tolist(), g["count"].tolist()))
    return any(now.get(r["task_index"], 0) > r["n_episodes"] for r in rows)


def _written(ds: Dataset, rows: list[dict], write: bool) -> list[dict]:
    """Write ``rows`` (when ``write``) and say so in one line: the loaders' only write."""
    if write and write_speed_file(ds, rows):
        log.warning(
            f"{ds.root}: wrote {SPEED_FILE} (speed percentiles of the episode lengths, "
            f"computed once); the loaders' speed='memory' or {SPEED_IN_MEMORY_ENV}=1 keeps "
            "them in memory instead"
        )
    return rows


def _load_or_compute(ds: Dataset, me: RankInfo, write: bool = True) -> list[dict]:
    try:
        file_rows = read_speed_file(ds)
    except SpeedFileError as exc:
        log_once(
            log, ("speed", "corrupt", ds.root), f"{exc}; using speed percentiles computed in memory"
        )
        return compute_speed_rows(ds)
    if file_rows is None:
        return _written(ds, compute_speed_rows(ds), write)
    if (
        me.is_main
        and file_fingerprints(file_rows) != {ds.fingerprint}
        and _episodes_added(ds, file_rows)
    ):
        log_once(
            log,
            ("speed", "stale", ds.root),
            f"{ds.root}: {SPEED_FILE} was computed before episodes were added; using it as it is "
            f"(run `episodekit metadata speed {ds.root} --force` to refresh)",
        )
    # Tasks with episodes here but no row in the file: compute and append them.
    present = {r["task_index"] for r in file_rows}
    used = _task_groups(ds, warn=False)["task_index"].tolist()
    if all(t in present for t in used):
        return file_rows
    new = [r for r in compute_speed_rows(ds) if r["task_index"] not in present and r["n_episodes"]]
    rows = sorted([*file_rows, *new], key=lambda r: r["task_index"])
    return _written(ds, rows, write)


def load_or_compute(ds: Dataset, write: bool = True) -> list[dict]:
    """Runtime path: the speed rows of ``ds`` for a training job, identical on every rank.

    Uses the file as it is when present (rows verbatim; tasks missing from it are computed and
    appended), else computes it. Only the global main process writes, and says so in one line;
    ``write=False`` (or a read-only or remote root, with one warning) keeps the result in memory.
    Warns once (main rank) when episodes were added since the file was written; a subset of the
    file's episodes is silent. Under torch.distributed every rank reaches one barrier before
    returning, also on errors.
    """
    me = rank_info()
    try:
        return _load_or_compute(ds, me, write)
    finally:
        if me.uses_torch:
            barrier()


def speed_table(ds: Dataset, rows: Sequence[dict]) -> list[dict]:
    """Per-task summary for display: episodes, distinct lengths, p5 / median / p95, sparse."""
    g = _task_groups(ds, warn=False)
    where = dict(zip(g["task_index"].tolist(), range(len(g["task_index"]))))
    table = []
    for r in rows:
        k = where.get(r["task_index"])
        median = None
        if k is not None:
            s, n = int(g["start"][k]), int(g["count"][k])
            median = float(np.median(g["lengths"][s : s + n]))
        p = r["percentiles"]
        table.append(
            {
                "task_index": r["task_index"],
                "task": r["task"],
                "episodes": r["n_episodes"],
                "distinct_lengths": int(g["distinct"][k]) if k is not None else 0,
                "p5": p[0] if p else None,
                "p50": median,
                "p95": p[-1] if p else None,
                "sparse": p is None,
            }
        )
    return table


def speed_report(root: Dataset | str | os.PathLike, force: bool = False) -> dict:
    """Ensure the root's speed file is fresh and describe it: status and the per-task table."""
    ds, rows, status = ensure_speed_rows(root, force=force)
    return {
        "root": ds.root,
        "file": SPEED_FILE,
        "status": status,
        "fingerprint": ds.fingerprint,
        "tasks": speed_table(ds, rows),
    }
