"""What is read a second time: near-duplicate candidates confirmed on the flagged episodes' rows,
and the offending signal attached to the kept findings."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core import interrupt
from episodekit.core.words import plural
from episodekit.validate.quality.frames import FRAME_CHECKS, finding_frames
from episodekit.validate.quality.merge import Merged
from episodekit.validate.quality.scan import (
    BATCH_ROWS,
    open_data_file,
    ordered_rows,
)
from episodekit.validate.quality.signals import (
    Candidate,
    episode_of,
)
from episodekit.validate.quality.summaries import (
    feature_matrix,
)
from episodekit.validate.quality.thresholds import (
    SIGNAL_POINTS,
)
from episodekit.validate.raw import RawRoot


def _scaled_summaries(m: Merged) -> Iterator[np.ndarray]:
    """The columns of the (episode, summary) matrix the duplicate search compares, one at a
    time: min, max and mean of every dimension of every feature over the dimension's robust
    range (finite; 0 where unknown). One column at a time: the whole matrix would cost
    ~3 x dimensions x 8 bytes per episode, several times over in the comparisons."""
    L = m.rows.astype(np.float64)
    keys, scales = [], []
    for name, c in m.features.items():
        s = m.scales[name]
        span = np.where(np.isfinite(s["span"]) & (s["span"] > 0), s["span"], 1.0)
        keys += [(c, key) for key in ("mins", "maxs", "sums")]
        scales += [span] * 3
    scale = np.concatenate(scales)  # the dtype a column is divided in, as a whole matrix would
    k = 0
    for c, key in keys:
        for j in range(c[key].shape[1]):
            with np.errstate(all="ignore"):
                col = c[key][:, j].astype(np.float64)
                if key == "sums":
                    col /= L
                col /= scale[k]
            yield np.nan_to_num(col, copy=False)
            k += 1


def duplicate_candidates(m: Merged, th: dict, window: int = 4) -> list[tuple[int, int]]:
    """Pairs of merged rows (earlier episode first) with equal length and summaries (min, max,
    mean of every dimension) within tolerance: neighbours after sorting by (length, summary)."""
    if len(m.episodes) < 2 or not m.features:
        return []
    cols = _scaled_summaries(m)
    first = next(cols)
    order = np.lexsort((first, m.rows))
    widths = range(1, min(window, len(order) - 1) + 1)
    # the largest |difference| over all summary columns of each pair of neighbours w apart
    dist = {w: np.zeros(len(order) - w) for w in widths}
    for col in itertools.chain([first], cols):
        s = col[order]
        for w in widths:
            np.maximum(dist[w], np.abs(s[w:] - s[:-w]), out=dist[w])
    tol = th["duplicate_tolerance"] + 1e-6
    pairs = set()
    for w in widths:
        a, b = order[:-w], order[w:]
        same = (m.rows[a] == m.rows[b]) & (dist[w] <= tol)
        for i, k in zip(a[same].tolist(), b[same].tolist()):
            pairs.add((i, k) if m.episodes[i] < m.episodes[k] else (k, i))
    return sorted(pairs, key=lambda p: (m.episodes[p[1]], m.episodes[p[0]]))


def read_episode_values(
    raw: RawRoot, wanted: dict[str, set[int]], columns: Iterable[str]
) -> dict[int, dict[str, np.ndarray]]:
    """episode -> column -> values ((frames, d) for list columns) for the wanted episodes of each
    data file; every file is read once, batch by batch, keeping only the wanted episodes' rows.
    Unreadable files are skipped."""
    out: dict[int, dict[str, np.ndarray]] = {}
    columns = list(columns)
    for rel, eps in wanted.items():
        table = wanted_rows(raw, rel, eps, columns)
        if table is None:
            continue
        ep, order = ordered_rows(table)
        if order is not None:
            table = table.take(pa.array(order))
        for e in eps:
            sel = np.flatnonzero(ep == e)
            if len(sel):
                out[e] = episode_values(table.slice(int(sel[0]), len(sel)), columns)
    return out


def wanted_rows(raw: RawRoot, rel: str, eps: set[int], columns: list[str]) -> pa.Table | None:
    """The rows of episodes ``eps`` of one data file, in file order (None: unreadable)."""
    keep = pa.array(sorted(eps), pa.int64())
    parts = []
    try:
        with open_data_file(raw.fs, raw.join(rel)) as pf:
            names = set(pf.schema_arrow.names)
            cols = [c for c in ("episode_index", "index", *columns) if c in names]
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=cols):
                ep = batch.column("episode_index").cast(pa.int64(), safe=False)
                mask = pc.is_in(ep, value_set=keep)
                if pc.any(mask).as_py():
                    parts.append(pa.Table.from_batches([batch.filter(mask)]))
            schema = pf.schema_arrow
    except Exception:  # noqa: BLE001 - reported by the first pass
        interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
        return None
    if not parts:
        return pa.table({c: pa.array([], schema.field(c).type) for c in cols})
    return pa.concat_tables(parts)


def episode_values(part: pa.Table, columns: list[str]) -> dict[str, np.ndarray]:
    vals = {}
    for c in columns:
        if c not in part.column_names:
            continue
        col = part[c].combine_chunks()
        t = col.type
        if pa.types.is_fixed_size_list(t) or pa.types.is_list(t):
            d = t.list_size if pa.types.is_fixed_size_list(t) else None
            if d is None:
                d = int(col.value_lengths()[0].as_py() or 1)
            x = feature_matrix(col, d)
        else:
            x = feature_matrix(col, 1)
        if x is not None:
            vals[c] = x
    return vals


def confirm_duplicates(
    raw: RawRoot, m: Merged, pairs: list[tuple[int, int]], th: dict, limit: int
) -> list[Candidate]:
    if not pairs:
        return []
    pairs = pairs[: limit * 4]
    wanted: dict[str, set[int]] = {}
    for i, k in pairs:
        for r in (i, k):
            wanted.setdefault(m.file_of(r), set()).add(int(m.episodes[r]))
    vals = read_episode_values(raw, wanted, m.features)
    spans = {n: m.scales[n]["span"] for n in m.features}
    out, seen = [], set()
    for i, k in pairs:
        a, b = vals.get(int(m.episodes[i])), vals.get(int(m.episodes[k]))
        if a is None or b is None or int(m.episodes[k]) in seen:
            continue
        worst = 0.0
        for n in m.features:
            if n not in a or n not in b or a[n].shape != b[n].shape:
                worst = math.inf
                break
            span = np.where(spans[n] > 0, spans[n], 1.0)
            with np.errstate(invalid="ignore"):
                worst = max(worst, float(np.nanmax(np.abs(a[n] - b[n]) / span)))
        if worst <= th["duplicate_tolerance"]:
            seen.add(int(m.episodes[k]))
            kind = "identical to" if worst == 0 else f"within {worst:.2g} of the range of"
            out.append(
                Candidate(
                    "quality.duplicate",
                    f"{', '.join(m.features)} {kind} episode {int(m.episodes[i])} at every frame "
                    f"({plural(int(m.rows[k]), 'frame')})",
                    feature=next(iter(m.features)),
                    value=worst,
                    score=1.0,
                    details={"duplicate_of": int(m.episodes[i])},
                    **episode_of(m, k),
                )
            )
    return out


def _locate(c: Candidate, x: np.ndarray) -> int | None:
    if c.locate == "step" and len(x) >= 2:
        return int(np.argmax(np.abs(np.diff(x)))) + 1
    if c.locate == "max":
        return int(np.argmax(x))
    if c.locate == "min":
        return int(np.argmin(x))
    return None


def _signal(x: np.ndarray, at: int | None) -> list[float]:
    """At most SIGNAL_POINTS values of ``x``: the whole episode bucketed (keeping each bucket's
    most extreme value, so a one-frame spike survives), or a window around ``at``."""
    if len(x) <= SIGNAL_POINTS:
        return [float(v) for v in x]
    edges = np.linspace(0, len(x), SIGNAL_POINTS + 1).astype(int)
    mid = np.median(x)
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        seg = x[a:b]
        out.append(float(seg[np.argmax(np.abs(seg - mid))]))
    return out


def attach_signals(raw: RawRoot, cands: list[Candidate], signals: bool = True) -> None:
    """Frame position and a short signal for per-episode findings with a feature, and the
    frames a frame-level finding points at (``details.frames``, :mod:`.frames`); re-reads only
    the flagged episodes. ``signals=False``: the frames only (the findings past the cap)."""
    need = [c for c in cands if c.episode is not None and c.feature and c.file]
    if signals:  # drift: its own per-episode signal
        need = [c for c in need if "signal" not in c.details]
    else:
        need = [c for c in need if c.check in FRAME_CHECKS]
    if not need:
        return
    wanted: dict[str, set[int]] = {}
    cols: set[str] = set()
    for c in need:
        wanted.setdefault(c.file, set()).add(c.episode)
        cols.add(c.feature)
    vals = read_episode_values(raw, wanted, cols)
    for c in need:
        full = vals.get(c.episode, {}).get(c.feature)
        if full is None:
            continue
        if c.dimension is not None:
            x = full[:, c.dimension]
        elif c.feature == "timestamp":
            x = np.diff(full[:, 0]) * (raw.fps or 1.0) if len(full) > 1 else full[:, 0]
        else:
            x = full[:, 0]
        at = _locate(c, x)
        if c.check in FRAME_CHECKS:
            frames = finding_frames(c.check, full, c.dimension, c.limits, at)
            if frames is not None:
                c.details["frames"] = frames
        if not signals:
            continue
        if at is not None:
            c.details["frame"] = at
            c.message += f" at frame {at}"
        c.details["signal"] = _signal(x, at)
