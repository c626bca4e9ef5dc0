"""The scanning: one data file's blocks read (executor jobs) for the stats pass
(:func:`scan_file`), the exact selection's second pass (:func:`refine_file`) and its narrowing
rounds (:func:`count_file`)."""

from __future__ import annotations

import os
import posixpath
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core.dataset import DatasetError, resolve_root
from episodekit.core.parquet_read import DataFile, open_data_file, parquet_errors
from episodekit.metadata.stats.blocks import block_stats, episode_segments, feature_values
from episodekit.metadata.stats.keys import (
    QUANTILES,
)
from episodekit.metadata.stats.spill import Spill


def open_parquet(root: str, rel: str) -> DataFile:
    """One data file of ``root``, opened through the data-file layer (its errors name the file);
    :func:`batches` closes it."""
    fs, path = resolve_root(root)
    return open_data_file(posixpath.join(path, rel), fs)


def file_batches(
    root: str, rel: str, columns: list[str], rows: int, threads: bool = False, windows=None
):
    """The rows of data file ``rel`` of ``root`` as :func:`batches` gives them; ``windows``
    (a salvage and its template, for a file repair wrote under a new footer): a window of row
    groups at a time under footers of their own, never one footer of them all
    (:func:`~episodekit.core.parquet_salvage.windows`)."""
    if windows is None:
        yield from batches(open_parquet(root, rel), columns, rows, threads)
        return
    from episodekit.core import parquet_salvage as ps

    fs, path = resolve_root(root)
    salvage, template = windows
    yield from ps.windows(os.path.join(path, rel), salvage, template).tables(columns, rows)


def batches(df: DataFile, columns: list[str], rows: int, threads: bool = False):
    """The file's rows in blocks of at most ``rows`` rows: consecutive row groups that fit are
    decoded together (whole row groups decode faster than record batches, and LeRobot's
    one-group-per-episode files do not become one block per episode); a larger row group is
    cut into record batches. Single-threaded unless ``threads`` (these run as executor jobs);
    the file is closed at the end, or when the caller stops early."""
    with df:
        missing = [c for c in columns if c not in df.schema.names]
        if missing:
            raise DatasetError(f"data file lacks columns {missing}", df.path)
        pf, groups, held = df.parquet, [], 0
        with parquet_errors(df.path):
            for i, n in enumerate(df.row_group_rows().tolist()):
                if groups and held + n > rows:
                    yield pf.read_row_groups(groups, columns=columns, use_threads=threads)
                    groups, held = [], 0
                if n > rows:
                    yield from pf.iter_batches(
                        batch_size=rows, row_groups=[i], columns=columns, use_threads=threads
                    )
                    continue
                groups.append(i)
                held += n
            if groups:
                yield pf.read_row_groups(groups, columns=columns, use_threads=threads)


def scan_file(job: dict) -> dict:
    """Pass 1 over one data file (executor job): per-episode stats and rank summaries.

    ``job``: root, rel, features ``{name: dims}``, points, batch_rows, and optionally spill (a
    folder) and file_id: every block's sorted columns are appended to one file there (``runs``:
    per feature, records of :class:`Spill`). Returns ``episodes`` (episode_index in file
    order), ``count`` per episode, ``block_episodes`` (episodes per block) and per feature
    ``min, max, mean, m2, q`` (5 x episodes x D), ``sketch`` parts [(values, weights)] and
    ``points``: per block the episodes' sketch points (D x their points; :func:`pack` ed when
    ``job["pack"]``: results that travel through Ray's object store)."""
    feats: dict[str, int] = job["features"]
    pf = open_parquet(job["root"], job["rel"])
    columns = list(dict.fromkeys(["episode_index", *feats]))
    parts: list[dict] = []
    eps: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    carry_ep = np.zeros(0, np.int64)
    carry: dict[str, np.ndarray] = {}
    spill = None
    if job.get("spill") is not None:
        spill = Spill(os.path.join(job["spill"], f"{job['file_id']}.bin"))

    def flush(ep: np.ndarray, pieces: dict[str, list[np.ndarray]]) -> None:
        starts, lens = episode_segments(ep)
        eps.append(ep[starts])
        counts.append(lens)
        parts.append(
            {n: block_stats(p, starts, lens, job["points"], spill) for n, p in pieces.items()}
        )

    try:
        for batch in batches(pf, columns, job["batch_rows"]):
            ep = batch.column("episode_index").to_numpy().astype(np.int64, copy=False)
            if not len(ep):
                continue
            vals = {n: feature_values(batch.column(n), d, n) for n, d in feats.items()}
            last = int(episode_segments(ep)[0][-1])  # the last episode may go on in the next block
            if last == 0 and len(carry_ep) and carry_ep[-1] == ep[0]:  # it still goes on
                carry_ep = np.concatenate([carry_ep, ep])
                carry = {n: np.concatenate([carry[n], v]) for n, v in vals.items()}
                continue
            head = np.concatenate([carry_ep, ep[:last]])
            if len(head):
                held = {n: [carry[n]] if carry else [] for n in feats}
                flush(head, {n: [*held[n], v[:last]] for n, v in vals.items()})
            carry_ep = ep[last:].copy()
            carry = {n: v[last:].copy() for n, v in vals.items()}  # frees the decoded block
            del batch, vals
            pa.default_memory_pool().release_unused()  # keeps a worker's RSS at one block
        if len(carry_ep):
            flush(carry_ep, {n: [c] for n, c in carry.items()})
    except DatasetError as exc:
        raise DatasetError(str(exc), posixpath.join(job["root"], job["rel"])) from exc
    finally:
        if spill is not None:
            spill.close()
    out: dict[str, Any] = {
        "runs": {n: [r for p in parts for r in p[n]["runs"]] for n in feats},
        "episodes": np.concatenate(eps) if eps else np.zeros(0, np.int64),
        "count": np.concatenate(counts) if counts else np.zeros(0, np.int64),
        "block_episodes": [len(e) for e in eps],
        "features": {},
    }
    for n, d in feats.items():
        f = {
            k: np.concatenate([p[n][k] for p in parts]) if parts else np.zeros((0, d))
            for k in ("min", "max", "mean", "m2")
        }
        f["q"] = (
            np.concatenate([p[n]["q"] for p in parts], axis=1) if parts else np.zeros((5, 0, d))
        )
        f["sketch"] = [p[n]["sketch"] for p in parts]
        # per block: not copied together; packed when the result travels through Ray's store
        f["points"] = [pack(p[n]["points"]) if job.get("pack") else p[n]["points"] for p in parts]
        out["features"][n] = f
    return out


def pack(a: np.ndarray) -> tuple[str, tuple[int, ...], np.ndarray]:
    """``a`` as (dtype, shape, zstd of its bytes grouped by significance): a block's sketch
    points (most of a scan result) in ~57% of their bytes (measured: 31.6 -> 18.1 MB on a
    file of the bench's 8M-frame sample), so fewer pages of Ray's object store travel to and
    stay mapped in the driver. Lossless; :func:`unpack` gives the very array back."""
    a = np.ascontiguousarray(a)
    grouped = np.ascontiguousarray(a.reshape(-1).view(np.uint8).reshape(-1, a.itemsize).T)
    z = pa.compress(pa.py_buffer(grouped), "zstd")
    return a.dtype.str, a.shape, np.frombuffer(z, np.uint8)


def unpack(packed: tuple | np.ndarray) -> np.ndarray:
    """The array :func:`pack` packed (an array passes through as it is)."""
    if isinstance(packed, np.ndarray):
        return packed
    dtype, shape, z = np.dtype(packed[0]), tuple(packed[1]), packed[2]
    size = int(np.prod(shape)) * dtype.itemsize
    raw = pa.decompress(pa.py_buffer(z), size, "zstd")
    grouped = np.frombuffer(raw, np.uint8).reshape(dtype.itemsize, -1)
    return np.ascontiguousarray(grouped.T).view(dtype).reshape(shape)


def refine_file(job: dict) -> dict:
    """Pass 2 over one data file (exact quantiles): per feature and bracket ``(lo, hi)`` (5 x D
    each), how many values are ``<= lo`` and the values strictly inside ``(lo, hi)``."""
    feats: dict[str, int] = job["features"]
    below = {n: np.zeros((len(QUANTILES), d), np.int64) for n, d in feats.items()}
    found: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {n: [] for n in feats}
    rows, windows = job["batch_rows"], job.get("windows")
    for batch in file_batches(job["root"], job["rel"], list(feats), rows, windows=windows):
        for n, d in feats.items():
            x = feature_values(batch.column(n), d, n).astype(np.float64)
            for i in range(len(QUANTILES)):
                above = x > job["lo"][n][i]
                below[n][i] += len(x) - above.sum(0)
                flat = np.flatnonzero(above & (x < job["hi"][n][i]))
                qi = np.full(len(flat), i, dtype=np.int8)
                found[n].append((qi, (flat % d).astype(np.int32), x.reshape(-1)[flat]))
    return {
        "below": below,
        "inside": {
            n: run_length(*(np.concatenate([f[i] for f in parts]) for i in range(3)))
            if parts
            else (np.zeros(0, np.int8), np.zeros(0, np.int32), np.zeros(0), np.zeros(0, np.int64))
            for n, parts in found.items()
        },
    }


def run_length(qi: np.ndarray, dim: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, ...]:
    """Candidates as distinct (quantile, dimension, value) with their counts: a tie (a constant
    or few-valued dimension) travels as one entry, not as every frame that holds it."""
    if not len(val):
        return qi, dim, val, np.zeros(0, np.int64)
    order = np.lexsort((val, dim, qi))
    qi, dim, val = qi[order], dim[order], val[order]
    new = np.concatenate(
        [[True], (qi[1:] != qi[:-1]) | (dim[1:] != dim[:-1]) | (val[1:] != val[:-1])]
    )
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(val)))
    return qi[starts], dim[starts], val[starts], counts.astype(np.int64)


def count_file(job: dict) -> dict:
    """A narrowing round over one data file: per feature, quantile, dimension and edge of
    ``job["edges"]`` (5 x D x B+1), how many values are ``<=`` it, NaN counted as
    :func:`refine_file` counts it (a few KiB back)."""
    feats: dict[str, int] = job["features"]
    cum = {n: np.zeros(job["edges"][n].shape, np.int64) for n in feats}
    rows, windows = job["batch_rows"], job.get("windows")
    for batch in file_batches(job["root"], job["rel"], list(feats), rows, windows=windows):
        for n, d in feats.items():
            x = np.sort(feature_values(batch.column(n), d, n).astype(np.float64), axis=0)
            nan = np.isnan(x).sum(axis=0)
            e = job["edges"][n]
            for j in range(d):
                cum[n][:, j, :] += np.searchsorted(x[:, j], e[:, j, :], side="right") + nan[j]
    return {"cum": cum}
