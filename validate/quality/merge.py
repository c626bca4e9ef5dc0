"""Files' summaries merged into the dataset's (:class:`Merged`), one file at a time as they
arrive, so the driver holds one copy of the per-episode summaries."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from episodekit.validate.quality.summaries import (
    TS_FILL,
    FeatureStats,
    FileStats,
    robust_scales,
)


class _Column:
    """One merged array, grown by appending copies along its first axis (the capacity doubles
    when short), so that what was appended (with Ray, a view of an object-store buffer) can be
    dropped at once. Appending a wider dtype widens the column, as ``np.concatenate`` would."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.buf: np.ndarray | None = None
        self.n = 0

    def append(self, a: np.ndarray) -> None:
        if self.buf is None:
            self.buf = np.empty((max(self.capacity, len(a)), *a.shape[1:]), a.dtype)
        dtype = np.result_type(self.buf, a)
        if dtype != self.buf.dtype or self.n + len(a) > len(self.buf):
            size = len(self.buf) if self.n + len(a) <= len(self.buf) else 2 * (self.n + len(a))
            grown = np.empty((size, *self.buf.shape[1:]), dtype)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n : self.n + len(a)] = a
        self.n += len(a)

    def take(self, order: np.ndarray | None) -> np.ndarray:
        """The appended rows (in ``order``, when given), releasing the buffer."""
        buf, self.buf = self.buf, None
        assert buf is not None
        return buf[: self.n] if order is None else buf[order]


@dataclass
class Merged:
    """Per-episode summaries of the whole dataset (one row per scanned episode, in the order of
    the data files), and per feature the dataset-level robust scales of its strided sample (the
    sample itself is dropped once they are computed)."""

    episodes: np.ndarray
    rows: np.ndarray
    file: np.ndarray  # int32: position in ``files`` of the episode's data file
    files: list[str]
    ts_drops: np.ndarray
    ts_missing: np.ndarray
    ts_maxstep: np.ndarray
    ts_interval: np.ndarray
    features: dict[str, dict[str, np.ndarray]]
    scales: dict[str, dict[str, np.ndarray]]
    failed: list[tuple[str, str]]
    scanned: set[str]  # files read without error

    def file_of(self, i: int) -> str:
        return self.files[int(self.file[i])]


class Merger:
    """Folds the per-file :class:`FileStats` into one :class:`Merged` as they arrive, in any
    order: every part is copied into the merged columns and can be dropped at once, so the
    driver holds one copy of the per-episode summaries (not every part plus their merge).
    Episode rows are put in file order at the end (what the checks' tie-breaks see); the
    strided sample keeps the arrival order (only its quantiles and medians are used)."""

    def __init__(self, rels: list[str], features: dict[str, int], episodes: int, samples: int):
        self.rels, self.features = rels, features
        self.episodes, self.samples = episodes, samples  # capacities (grown when short)
        self.cols: dict[str, _Column] = {}
        self.feats: dict[str, dict[str, _Column]] = {}
        self.missing: dict[str, int] = dict.fromkeys(features, 0)  # rows before its first part
        self.spans: list[tuple[int, int, int]] = []  # (file position, first row, rows)
        self.n = 0
        self.failed: list[tuple[int, str, str]] = []  # (file position, file, error)
        self.scanned: set[str] = set()

    def _col(self, cols: dict[str, _Column], key: str, capacity: int) -> _Column:
        if key not in cols:
            cols[key] = _Column(capacity)
        return cols[key]

    def add(self, pos: int, p: FileStats) -> None:
        if p.error is not None:
            self.failed.append((pos, p.file, p.error))
            return
        self.scanned.add(p.file)
        n = len(p.episodes)
        if not n:
            return
        self.spans.append((pos, self.n, n))
        self._col(self.cols, "episodes", self.episodes).append(p.episodes)
        self._col(self.cols, "rows", self.episodes).append(p.rows)
        self._col(self.cols, "file", self.episodes).append(np.full(n, pos, np.int32))
        for key, fill in TS_FILL.items():
            got = getattr(p, key)
            self._col(self.cols, key, self.episodes).append(
                got if got is not None else np.full(n, fill)
            )
        for name, d in self.features.items():
            self._add_feature(name, d, p.features.get(name), n)
        self.n += n

    def _add_feature(self, name: str, d: int, fs: FeatureStats | None, n: int) -> None:
        """One file's summaries of one feature; NaN rows where the file has none (ragged)."""
        if fs is None and name not in self.feats:
            self.missing[name] += n  # filled in if a later file has the feature
            return
        if name not in self.feats:
            self.feats[name] = {}
            if self.missing[name]:
                self._add_feature(name, d, None, self.missing[name])
        cols = self.feats[name]
        for key in FeatureStats.__dataclass_fields__:
            if key.startswith("sample"):
                if fs is not None:
                    self._col(cols, key, self.samples).append(getattr(fs, key))
                continue
            if fs is not None:
                arr = getattr(fs, key)
            else:
                arr = np.full((n,) if key.startswith("frozen") else (n, d), np.nan)
            self._col(cols, key, self.episodes).append(arr)

    def finish(self) -> Merged:
        """The merged summaries in file order; the samples become the robust scales."""
        order = None
        by_file = sorted(self.spans)
        if by_file != self.spans:
            order = np.concatenate([np.arange(s, s + n) for _, s, n in by_file])

        def take(col: _Column | None, empty: np.ndarray) -> np.ndarray:
            return empty if col is None else col.take(order)

        none = np.zeros(0)
        cols = {k: take(self.cols.pop(k, None), none) for k in ("episodes", "rows", *TS_FILL)}
        file = take(self.cols.pop("file", None), np.zeros(0, np.int32))
        features, scales = {}, {}
        for name, fcols in self.feats.items():
            sample = {k: fcols.pop(k).take(None) for k in ("sample_values", "sample_steps")}
            scales[name] = robust_scales(sample)
            del sample
            features[name] = {k: c.take(order) for k, c in fcols.items()}
        self.feats = {}
        return Merged(
            episodes=cols.pop("episodes").astype(np.int64, copy=False),
            rows=cols.pop("rows").astype(np.int64, copy=False),
            file=file,
            files=self.rels,
            features=features,
            scales=scales,
            failed=[(f, e) for _, f, e in sorted(self.failed)],
            scanned=self.scanned,
            **cols,
        )
