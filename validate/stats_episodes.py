"""Per-episode stats (``stats/{feature}/{key}`` columns of ``meta/episodes``), one episodes file at
a time: present, finite, shaped, ordered, counting the frames, and merged for
``stats.consistent``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.dataset import DatasetError
from episodekit.core.words import plural
from episodekit.metadata.stats import (
    QUANTILE_KEYS,
    STAT_KEYS,
)
from episodekit.metadata.stats.episode_merge import MERGED_KEYS, EpisodeMerge
from episodekit.validate.raw import ERROR, Finding, RawRoot
from episodekit.validate.stats_rules import (
    ORDER_TOLERANCE,
    missing_finding,
    order_violations,
)

# Per-episode stats, one episodes file at a time: the driver holds one file's columns of one
# feature and, per file, a few numbers per check (and the merge's vectors), never every
# episode's stats (except for --deep, which compares every episode with a recomputation).
# Findings are those of the whole table sorted by episode: a check's finding names the smallest
# offending episode of every file, and a key dropped anywhere (missing, misshapen, NaN) is left
# out of the order checks everywhere (files checked with other keys are checked again).


@dataclass
class _FilePart:
    """One episodes file's summary of one feature's per-episode stats.

    ``valid``: keys present with the expected shape; ``finite``: those finite in every episode of
    the file (the keys ``order``, ``count`` and ``merge`` were computed with); ``nonfinite``: key
    -> (episodes, smallest episode); ``order``: (episodes, smallest episode, [(relation, hit)]);
    ``count``: (episodes, smallest episode, its count, its length) or None (no lengths);
    ``values``: the per-episode values, kept only for ``--deep``."""

    valid: tuple[str, ...]
    finite: tuple[str, ...]
    nonfinite: dict[str, tuple[int, int]]
    order: tuple[int, int, list[tuple[str, bool]]]
    count: tuple[int, int, int, int] | None
    merge: EpisodeMerge | None
    values: dict[str, np.ndarray] | None


@dataclass
class _EpisodeStats:
    """What the per-episode part hands on: findings, the merge per feature, and (``--deep``
    only) every episode's values sorted by episode."""

    findings: list[Finding]
    merged: dict[str, dict[str, np.ndarray] | None]
    ep: np.ndarray
    episodes: dict[str, dict[str, np.ndarray]]


def _column_values(t: pa.Table, c: str, want: int, dims: int, rel: str, ep: np.ndarray, out):
    """A stats column as ``(episodes, want)`` float64 values, or None (with a finding)."""
    col = t[c].combine_chunks()
    if not (
        pa.types.is_list(col.type)
        or pa.types.is_large_list(col.type)
        or pa.types.is_fixed_size_list(col.type)
    ):
        msg = f"{c}: type {col.type}, expected a list per episode"
        out.append(Finding("stats.shape", ERROR, msg, rel))
        return None
    lengths = pc.list_value_length(col).fill_null(-1).to_numpy()
    bad = np.flatnonzero(lengths != want)
    if len(bad):
        msg = (
            f"{c}: {plural(len(bad), 'episode')} with {lengths[bad[0]]} values, expected {want} "
            f"(feature shape [{dims}])"
        )
        out.append(Finding("stats.shape", ERROR, msg, rel, int(ep[bad[0]])))
        return None
    vals = pc.list_flatten(col).cast(pa.float64()).fill_null(np.nan).to_numpy()
    return vals.reshape(-1, want)


def _read_feature(pf, n: str, dims: int, keys, rel: str, ep: np.ndarray, out) -> dict:
    """``{key: (episodes, D) values}`` of feature ``n`` for the ``keys`` with a good shape.

    One column read at a time: the Arrow buffers of a file's whole feature (every key at once,
    ~10,000 episodes in a 24 MB episodes file) were the driver's largest transient in ``prepare
    --executor ray``'s validate step; only the float64 values stay."""
    got = {}
    for k in keys:
        c = f"stats/{n}/{k}"
        t = pf.read(columns=[c])
        v = _column_values(t, c, 1 if k == "count" else dims, dims, rel, ep, out)
        del t
        if v is not None:
            got[k] = v
    return got


def _order_summary(got: dict[str, np.ndarray], ep: np.ndarray):
    """(episodes violating an order relation, the smallest of them, [(relation, violated)])."""
    bad = np.zeros(len(ep), bool)
    hits = []
    for what, mask in order_violations(got):
        rows = np.any(mask, axis=1)
        hits.append((what, bool(np.any(rows))))
        bad |= rows
    return int(bad.sum()), int(ep[bad].min()) if np.any(bad) else -1, hits


def _feature_part(got: dict, ep: np.ndarray, lengths: np.ndarray | None, keep: bool) -> _FilePart:
    """Summarize one file's values of one feature (see :class:`_FilePart`)."""
    valid = tuple(got)
    nonfinite = {}
    for k, v in got.items():
        bad = ~np.all(np.isfinite(v), axis=1)
        if np.any(bad):
            nonfinite[k] = (int(bad.sum()), int(ep[bad].min()))
    fin = {k: v for k, v in got.items() if k not in nonfinite}
    count = None
    if "count" in fin and lengths is not None:
        bad = np.flatnonzero(fin["count"][:, 0] != lengths)
        i = int(bad[np.argmin(ep[bad])]) if len(bad) else 0
        first = (int(ep[i]), int(fin["count"][i, 0]), int(lengths[i])) if len(bad) else (-1, 0, 0)
        count = (len(bad), *first)
    merge = None
    if set(MERGED_KEYS) <= set(fin):
        merge = EpisodeMerge()
        merge.add(fin)
    return _FilePart(
        valid,
        tuple(fin),
        nonfinite,
        _order_summary(fin, ep),
        count,
        merge,
        got if keep else None,
    )


class _Lengths:
    """Episode lengths looked up by episode index (none when the table's indices repeat)."""

    def __init__(self, raw: RawRoot):
        e = raw.episodes
        idx = e["episode_index"].to_numpy()
        self.ok = len(idx) > 0 and len(np.unique(idx)) == len(idx)
        order = np.argsort(idx, kind="stable")
        self.idx, self.length = idx[order], e["length"].to_numpy()[order]

    def of(self, ep: np.ndarray) -> np.ndarray | None:
        """The lengths of ``ep`` (None when ``ep`` repeats or names an unknown episode)."""
        if not self.ok or len(np.unique(ep)) != len(ep):
            return None
        pos = np.minimum(np.searchsorted(self.idx, ep), len(self.idx) - 1)
        return self.length[pos] if np.array_equal(self.idx[pos], ep) else None


@contextlib.contextmanager
def _open_episodes(raw: RawRoot, rel: str) -> Iterator[Any]:
    """An episodes file's ``pyarrow.parquet.ParquetFile``, through the data-file layer (its
    handles closed on exit, a remote one's too; a remote one's bytes are read once per run:
    :meth:`RawRoot.remote_bytes`)."""
    with raw.meta_parquet(raw.join(rel)) as pf:
        yield pf


def _scan_file(raw, rel, feats, lengths: _Lengths, keep: bool):
    """One episodes file: (its findings, episode indices, lengths known, {feature: part}), or None
    when unreadable (the ``episodes.read`` check reports it)."""
    out: list[Finding] = []
    wanted = [f"stats/{n}/{k}" for n in feats for k in STAT_KEYS]
    try:
        with _open_episodes(raw, rel) as pf:
            names = pf.schema_arrow.names
            ep = pf.read(columns=["episode_index"])["episode_index"].to_numpy()
            missing = [c for c in wanted if c not in names]
            if missing and all(c.rsplit("/", 1)[-1] in QUANTILE_KEYS for c in missing):
                out.append(missing_finding("per-episode stats", missing, rel, raw.root))
            elif missing:
                msg = f"{plural(len(missing), 'stats column')} missing, e.g. {missing[:3]}"
                out.append(Finding("stats.present", ERROR, msg, rel))
            ln = lengths.of(ep)
            parts = {}
            for n, dims in feats.items():
                keys = [k for k in STAT_KEYS if f"stats/{n}/{k}" in names]
                got = _read_feature(pf, n, dims, keys, rel, ep, out)
                parts[n] = _feature_part(got, ep, ln, keep)
                del got
                pa.default_memory_pool().release_unused()  # else mimalloc keeps the reads
    except (DatasetError, pa.ArrowException, OSError):
        return None
    return out, ep, ln is not None, parts


def _reorder(raw, rel, n: str, dims: int, keys: tuple, part: _FilePart, ep: np.ndarray):
    """The order summary of one file checked with the dataset's keys of ``n`` (a key was dropped
    elsewhere): from the kept values, else read again."""
    if part.values is not None:
        return _order_summary({k: part.values[k] for k in keys}, ep)
    try:
        with _open_episodes(raw, rel) as pf:
            return _order_summary(_read_feature(pf, n, dims, list(keys), rel, ep, []), ep)
    except (DatasetError, pa.ArrowException, OSError):
        return 0, -1, []


def _feature_findings(raw, n: str, dims: int, files: list, lengths_ok: bool):
    """Findings on feature ``n`` from every file's part, and the keys left (valid, finite)."""
    out: list[Finding] = []
    parts = [f[2][n] for f in files]
    keys = []
    for k in (k for k in STAT_KEYS if all(k in p.valid for p in parts)):
        bad = [p.nonfinite[k] for p in parts if k in p.nonfinite]
        if bad:
            msg = f"stats/{n}/{k}: {plural(sum(b[0] for b in bad), 'episode')} with NaN/inf"
            out.append(Finding("stats.finite", ERROR, msg, None, min(b[1] for b in bad)))
        else:
            keys.append(k)
    keys = tuple(keys)
    orders = [
        p.order if p.finite == keys else _reorder(raw, rel, n, dims, keys, p, ep)
        for (rel, ep, _), p in zip(files, parts)
    ]
    rows = sum(o[0] for o in orders)
    if rows:
        hit = {}
        for o in orders:
            for what, h in o[2]:
                hit[what] = hit.get(what, False) or h
        msg = (
            f"stats/{n}: {plural(rows, 'episode')} with "
            f"{', '.join(w for w, h in hit.items() if h)} "
            f"(min <= q01 <= ... <= q99 <= max, min <= mean <= max; {ORDER_TOLERANCE})"
        )
        first = min(o[1] for o in orders if o[0])
        out.append(Finding("stats.order", ERROR, msg, None, first))
    counts = [p.count for p in parts if p.count is not None and p.count[0]]
    if "count" in keys and lengths_ok and counts:
        first = min(counts, key=lambda c: c[1])
        msg = (
            f"stats/{n}/count: {plural(sum(c[0] for c in counts), 'episode')} whose count is "
            f"not their length (e.g. {first[2]} vs {first[3]})"
        )
        out.append(Finding("stats.count", ERROR, msg, None, first[1]))
    return out, keys


def episode_part(raw: RawRoot, feats: dict[str, int], keep: bool = False) -> _EpisodeStats:
    """Findings on the per-episode columns, file by file, and the merge of each feature's
    stats; with ``keep`` (``--deep``) also every episode's values, sorted by episode."""
    out: list[Finding] = []
    files = []  # (rel, episode indices, {feature: _FilePart}) per readable file
    lengths_ok = True
    e = raw.episodes
    names = sorted(pc.unique(e["__file"]).to_pylist()) if e is not None else []
    lengths = _Lengths(raw) if names else None
    for rel in names:
        res = _scan_file(raw, rel, feats, lengths, keep)
        if res is None:
            continue
        found, ep, known, parts = res
        out += found
        lengths_ok &= known
        files.append((rel, ep, parts))
    if not files:
        return _EpisodeStats(out, {}, np.zeros(0, np.int64), {})
    ep = np.concatenate([f[1] for f in files])
    lengths_ok &= len(np.unique(ep)) == len(ep)
    merged: dict = {}
    episodes: dict = {}
    for n, dims in feats.items():
        found, keys = _feature_findings(raw, n, dims, files, lengths_ok)
        out += found
        merged[n] = None
        if set(MERGED_KEYS) <= set(keys):
            merge = EpisodeMerge()
            for f in files:
                merge.join(f[2][n].merge)
            merged[n] = merge.merged()
        if keep:
            order = np.argsort(ep, kind="stable")
            episodes[n] = {
                k: np.concatenate([f[2][n].values[k] for f in files])[order] for k in keys
            }
    return _EpisodeStats(out, merged, np.sort(ep, kind="stable"), episodes)


def order_rows(name: str, got: dict[str, np.ndarray], ep: np.ndarray) -> list[Finding]:
    bad = np.zeros(len(ep), bool)
    whats = []
    for what, mask in order_violations(got):
        rows = np.any(mask, axis=1)
        if np.any(rows):
            whats.append(what)
        bad |= rows
    rows = np.flatnonzero(bad)
    if not len(rows):
        return []
    msg = (
        f"stats/{name}: {plural(len(rows), 'episode')} with {', '.join(whats)} "
        f"(min <= q01 <= ... <= q99 <= max, min <= mean <= max; {ORDER_TOLERANCE})"
    )
    return [Finding("stats.order", ERROR, msg, None, int(ep[rows[0]]))]
