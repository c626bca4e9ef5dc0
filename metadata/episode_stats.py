"""Per-episode stats and rank summaries of a whole dataset, held on local disk, not in memory.

A stats pass returns, per data file, every episode's min/max/mean/m2 and quantiles of every
numeric feature: about 2.6 KB per episode for LeRobot's usual 33 dimensions, so 260 MB at 100,000
episodes, more than everything else the driver holds. :class:`EpisodeFold` folds the files'
results as they arrive into one spill file per feature (``(keys, episodes, D)`` float64, a slot
per listed episode, written through a memory map opened only while a result is copied in), so
the process holds the episode indices and counts and, at any time, one file's result.
:class:`EpisodeStats` reads back what a caller needs: one key of one feature (the dataset merge),
the rows of some episodes (an episodes file's slice being written), or a whole feature (checks
and tests). Values are the very float64 the scans computed; only where they sit changed. The
blocks' rank summaries (1,024 points per block of about 64 MiB: they grow with the frames) are
spilled per file too and read back one dimension at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

import numpy as np

from episodekit.core.dataset import DatasetError
from episodekit.core.spill import spill_folder

QUANTILE_KEYS = ("q01", "q10", "q50", "q90", "q99")
MOMENT_KEYS = ("min", "max", "mean", "m2")
KEYS = (*MOMENT_KEYS, "std", *QUANTILE_KEYS)  # a spill file's first axis


class EpisodeStats(Mapping):
    """``feature -> key -> (episodes, D)`` (sorted by episode), read from the spill files on
    access; :meth:`rows` and :meth:`chunks` read only part of them."""

    def __init__(self, episode_index: np.ndarray, count: np.ndarray, paths: dict[str, str], owner):
        self.episode_index = episode_index
        self.count = count
        self.paths = paths
        self._owner = owner  # the temporary folder: removed when this object goes

    def chunks(
        self, feature: str, keys: tuple[str, ...], size: int
    ) -> Iterator[tuple[slice, dict[str, np.ndarray]]]:
        """Some keys of one feature, ``size`` episodes at a time: ``(rows, {key: (n, D)})``."""
        spill = np.load(self.paths[feature], mmap_mode="r")
        for start in range(0, len(self.episode_index), size):
            rows = slice(start, min(start + size, len(self.episode_index)))
            yield rows, {k: np.array(spill[KEYS.index(k), rows]) for k in keys}

    def rows(self, pos: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
        """Every feature's keys for the episodes at positions ``pos`` (into episode_index)."""
        out = {}
        for n, path in self.paths.items():
            spill = np.load(path, mmap_mode="r")
            out[n] = {k: np.array(spill[i, pos]) for i, k in enumerate(KEYS)}
        return out

    def __getitem__(self, feature: str) -> dict[str, np.ndarray]:
        spill = np.load(self.paths[feature], mmap_mode="r")
        return {k: np.array(spill[i]) for i, k in enumerate(KEYS)}

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.paths)


class EpisodeFold:
    """The files' per-episode results folded, as they arrive (any order), into spill files
    with a slot per listed episode. Episodes the data holds but the episodes table does not
    list are kept aside and merged in by :meth:`finish` (they are counted as before); an
    episode found twice, or a listed one never found, is an error there."""

    def __init__(
        self, want: np.ndarray, feats: dict[str, int], files: int, spill_dir: str | None = None
    ):
        self.ep = np.unique(np.asarray(want, dtype=np.int64))
        self.feats = feats
        self.filled = np.zeros(len(self.ep), bool)
        self.count = np.zeros(len(self.ep), np.int64)
        self.weights: list[dict | None] = [None] * files  # per file: feature -> weights, error
        self.runs: list[dict | None] = [None] * files
        self.extra: list[tuple[np.ndarray, np.ndarray, dict]] = []
        self.dup: list[int] = []
        self.tmp = spill_folder("episodekit-episode-stats-", spill_dir)
        self.paths = {}
        for i, (n, d) in enumerate(feats.items()):
            self.paths[n] = os.path.join(self.tmp.name, f"{i}.npy")
            np.lib.format.open_memmap(self.paths[n], "w+", np.float64, (len(KEYS), len(self.ep), d))

    def add(self, i: int, r: dict) -> None:
        """Fold file ``i``'s scan result; nothing of ``r`` is kept (its arrays are copied)."""
        e = np.asarray(r["episodes"], dtype=np.int64)
        uniq, seen = np.unique(e, return_counts=True)
        self.dup += uniq[seen > 1].tolist()
        pos = np.minimum(np.searchsorted(self.ep, e), max(len(self.ep) - 1, 0))
        listed = (self.ep[pos] == e) if len(self.ep) else np.zeros(len(e), bool)
        slots = pos[listed]
        self.dup += self.ep[slots[self.filled[slots]]].tolist()
        self.filled[slots] = True
        self.count[slots] = np.asarray(r["count"])[listed]
        for n in self.feats:  # written through a map that goes with the loop's variable
            spill = np.load(self.paths[n], mmap_mode="r+")
            for k, v in _values(r["features"][n]):
                spill[KEYS.index(k), slots] = v[listed]
        if not listed.all():
            rest = ~listed
            feats = {
                n: {k: v[rest].copy() for k, v in _values(r["features"][n])} for n in self.feats
            }
            self.extra.append((e[rest].copy(), np.asarray(r["count"])[rest].copy(), feats))
        self.weights[i] = {}
        for j, n in enumerate(self.feats):
            blocks = r["features"][n]["sketch"]
            values = np.concatenate([v for v, _ in blocks]) if blocks else np.zeros((0, 0))
            np.save(self._summary_path(i, j), np.ascontiguousarray(values.T))  # (D, points)
            weights = np.concatenate([w for _, w in blocks]) if blocks else np.zeros(0, np.int64)
            self.weights[i][n] = (weights, float(sum(w.max() - 1 for _, w in blocks)))
        self.runs[i] = r["runs"]

    def _summary_path(self, i: int, j: int) -> str:
        return os.path.join(self.tmp.name, f"summary-{i}-{j}.npy")

    def summary(self, feature: str, dim: int) -> tuple[np.ndarray, np.ndarray, float]:
        """The blocks' rank summaries of one dimension, in file order: values, weights (as
        float64) and the summed rank error (read from the spill: one dimension at a time)."""
        j = list(self.feats).index(feature)
        files = [i for i, w in enumerate(self.weights) if w is not None]
        values = []
        for i in files:
            spill = np.load(self._summary_path(i, j), mmap_mode="r")
            values.append(np.array(spill[dim]) if spill.size else np.zeros(0))
        weights = np.concatenate([self.weights[i][feature][0] for i in files])
        error = float(sum(self.weights[i][feature][1] for i in files))
        return np.concatenate(values), weights.astype(np.float64), error

    def finish(self) -> EpisodeStats:
        """The episodes' stats, sorted by episode (``std`` filled in)."""
        if self.extra:
            uniq, seen = np.unique(np.concatenate([x[0] for x in self.extra]), return_counts=True)
            self.dup += uniq[seen > 1].tolist()
        if self.dup:
            first = min(self.dup)
            raise DatasetError(f"episode {first} appears in several places of the data files")
        missing = self.ep[~self.filled]
        if len(missing):
            raise DatasetError(f"episodes {missing[:5].tolist()} have no rows in the data files")
        ep, count = self.ep, self.count
        if self.extra:
            ep, count = self._merge_extra()
        for n in self.feats:
            spill = np.load(self.paths[n], mmap_mode="r+")
            spill[KEYS.index("std")] = np.sqrt(spill[KEYS.index("m2")] / count[:, None])
        return EpisodeStats(ep, count, dict(self.paths), self.tmp)

    def _merge_extra(self) -> tuple[np.ndarray, np.ndarray]:
        """Unlisted episodes into the spill files (rare: a broken episodes table)."""
        ep = np.concatenate([self.ep, *(x[0] for x in self.extra)])
        order = np.argsort(ep, kind="stable")
        count = np.concatenate([self.count, *(x[1] for x in self.extra)])[order]
        for i, (n, d) in enumerate(self.feats.items()):
            old = np.load(self.paths[n])
            path = os.path.join(self.tmp.name, f"{i}-all.npy")
            new = np.lib.format.open_memmap(path, "w+", np.float64, (len(KEYS), len(ep), d))
            for j, k in enumerate(KEYS):
                if k != "std":
                    new[j] = np.concatenate([old[j], *(x[2][n][k] for x in self.extra)])[order]
            self.paths[n] = path
        return ep[order], count


def _values(f: dict) -> Iterator[tuple[str, np.ndarray]]:
    """A scan result's per-episode arrays of one feature as (key, (episodes, D))."""
    for k in MOMENT_KEYS:
        yield k, f[k]
    for j, k in enumerate(QUANTILE_KEYS):
        yield k, f["q"][j]
