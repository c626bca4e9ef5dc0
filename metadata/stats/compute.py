"""The whole dataset: :func:`compute_stats` (scan, fold the episodes, merge, select) and
:func:`refine_quantiles`; :func:`data_state`, the data files' digest the freshness check uses."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

import episodekit.metadata.stats.blocks as blocks
from episodekit.core.dataset import V3, Dataset, DatasetError, as_dataset
from episodekit.core.executor import imap_files
from episodekit.core.spill import spill_folder
from episodekit.metadata.episode_stats import EpisodeFold, EpisodeStats
from episodekit.metadata.image_stats import (
    ImageStats,
    compute_image_stats,
    require_decoders,
)
from episodekit.metadata.stats.episode_sketch import EpisodeSketches
from episodekit.metadata.stats.keys import (
    BLOCK_BYTES,
    DEFAULT_MEMORY_MB,
    DEFAULT_SKETCH_POINTS,
    QUANTILE_MODES,
    numeric_features,
)
from episodekit.metadata.stats.scan import scan_file, unpack
from episodekit.metadata.stats.select import exact_from_runs, exact_quantiles
from episodekit.metadata.stats.sketch import (
    FeatureStats,
    Sketch,
)
from episodekit.metadata.stats.sketch_spill import SketchSpill, SpilledSketches

log = logging.getLogger(__name__)


@dataclass
class StatsResult:
    """Everything one computation produced (what is written, plus how)."""

    features: dict[str, int]
    episode_index: np.ndarray  # sorted
    episode_count: np.ndarray
    episode: EpisodeStats  # name -> key -> (episodes, D) (count excluded), on local disk
    dataset: dict[str, FeatureStats]
    mode: dict[str, str]  # name -> "exact" | "sketch"
    rank_error: dict[str, float]  # name -> bound of the dataset quantiles, as a fraction of N
    fingerprint: str = ""
    state: str = ""
    info: dict = field(default_factory=dict)
    images: ImageStats | None = None  # image/video stats (``images=True``), else kept as they are
    # per-episode quantile sketches (the sidecar), spilled to a temporary file as they came
    sketches: SpilledSketches | None = None

    def lerobot_stats(self) -> dict[str, dict[str, list]]:
        out = {n: self.dataset[n].to_lerobot() for n in self.features}
        if self.images is not None:
            out.update(self.images.lerobot_stats())
        return out


def _footer_bytes(fs, full: str) -> tuple[int, bytes]:
    """(size, footer bytes) of a parquet file: its content's fingerprint, without data pages."""
    with fs.open(full, "rb") as fh:
        size = fh.seek(0, 2)
        if size < 12:
            return size, b""
        fh.seek(size - 8)
        n = int.from_bytes(fh.read(4), "little")
        fh.seek(max(0, size - 8 - n))
        return size, fh.read(n)


def data_state(ds: Dataset) -> str:
    """Digest of the data files' state (relative path, size and parquet footer): changed data
    makes the stats stale; a byte-identical copy elsewhere (other mtimes) keeps them fresh."""
    h = hashlib.sha256(b"episodekit-stats-data-v1\0")
    for rel in ds.data_files:
        try:
            size, footer = _footer_bytes(ds.fs, ds.join(rel))
        except FileNotFoundError:
            h.update(f"{rel}\0missing\0".encode())
            continue
        h.update(f"{rel}\0{size}\0".encode())
        h.update(hashlib.sha256(footer).digest())
    return h.hexdigest()[:32]


SKETCH_CAP = 65_536  # points per dimension a dataset's merged summary keeps at most


MOMENT_CHUNK = 16_384  # episodes whose stats are merged at a time (memory: a chunk's, not all)


def _moments(per: EpisodeStats, n: str, w: np.ndarray, total: int) -> tuple[np.ndarray, ...]:
    """Dataset mean, m2 (Chan: the episodes' m2 plus their means' spread), min and max of one
    feature from its episodes' stats, :data:`MOMENT_CHUNK` episodes at a time."""
    mean = None
    for rows, c in per.chunks(n, ("mean",), MOMENT_CHUNK):
        part = (c["mean"] * w[rows]).sum(0)
        mean = part if mean is None else mean + part
    if mean is None:  # no episodes: nothing to merge
        raise DatasetError("no episodes to compute stats over")
    mean = mean / total
    m2 = lo = hi = None
    for rows, c in per.chunks(n, ("m2", "mean", "min", "max"), MOMENT_CHUNK):
        part = c["m2"].sum(0) + (w[rows] * (c["mean"] - mean) ** 2).sum(0)
        m2 = part if m2 is None else m2 + part
        lo = c["min"].min(0) if lo is None else np.minimum(lo, c["min"].min(0))
        hi = c["max"].max(0) if hi is None else np.maximum(hi, c["max"].max(0))
    return mean, m2, lo, hi


def _dataset_stats(feats, per: EpisodeStats, fold: EpisodeFold) -> dict[str, FeatureStats]:
    """Chan's merge of the episodes' moments; min/max; the merged rank summaries (one
    dimension at a time, at most :data:`SKETCH_CAP` points each: 64 blocks' worth, ~16M
    frames, kept whole; beyond, compacted with its rank error recorded)."""
    out = {}
    total = int(per.count.sum())
    w = per.count.astype(np.float64)[:, None]
    for n, d in feats.items():
        sketches = []
        for j in range(d):
            values, weights, error = fold.summary(n, j)
            order = np.argsort(values, kind="stable")
            sketches.append(Sketch(values[order], weights[order], error).compact(SKETCH_CAP))
        moments = _moments(per, n, w, total)
        out[n] = FeatureStats.from_sketches(total, float(total), moments, sketches)
    return out


def column_bytes(info: dict, feats: dict[str, int], frames: int) -> int:
    """Bytes of the feature columns over ``frames`` frames (what the exact selection holds)."""
    total = 0
    for n, d in feats.items():
        try:
            size = np.dtype(str(info["features"][n].get("dtype"))).itemsize
        except TypeError:
            size = 8
        total += frames * d * size
    return total


def block_rows(info: dict, feats: dict[str, int]) -> int:
    """Rows per decoded block: about :data:`BLOCK_BYTES` of feature values (plus episode_index)."""
    return max(1024, BLOCK_BYTES // (8 + column_bytes(info, feats, 1)))


@dataclass(frozen=True)
class StatsOptions:
    """How :func:`compute_stats` computes.

    ``quantiles="exact"``: while the feature columns fit ``memory_mb``, every block's sorted
    columns are kept (one spill file per data file in a temporary folder under ``spill_dir``,
    removed at the end; with ``executor="ray"`` a second pass over the data instead) and the
    dataset quantiles are selected exactly from them; beyond the budget, and with ``"sketch"``,
    they come from the merged rank summary (bound in ``rank_error``).
    ``sketch_points``: order statistics each block's rank summary keeps (per dimension).
    ``batch_rows``: rows per decoded block (default :func:`block_rows`, about 64 MiB).
    ``episodes``: restrict to these episode indices; they must fill whole data files (used to
    show that merging halves gives the whole).
    ``images``: also the image/video features' stats (see :mod:`episodekit.metadata.image_stats`);
    without it they are not computed and :func:`write_stats` keeps the existing ones."""

    features: list[str] | None = None
    quantiles: str = "exact"
    memory_mb: float = DEFAULT_MEMORY_MB
    sketch_points: int = DEFAULT_SKETCH_POINTS
    executor: str = "local"
    jobs: int | None = None
    batch_rows: int | None = None
    episodes: np.ndarray | None = None
    spill_dir: str | None = None
    images: bool = False

    def __post_init__(self) -> None:
        if self.quantiles not in QUANTILE_MODES:
            raise ValueError(f"quantiles must be one of {QUANTILE_MODES}, got {self.quantiles!r}")
        if self.images and self.episodes is not None:
            raise ValueError("images=True computes whole datasets (episodes= must be None)")


def compute_stats(
    root: Dataset | str | os.PathLike, options: StatsOptions | None = None, **overrides: Any
) -> StatsResult:
    """Compute (do not write) the stats of ``root`` (see the package docstring) as ``options``
    say; keyword ``overrides`` replace single fields (``compute_stats(root, jobs=1)``)."""
    opts = replace(options or StatsOptions(), **overrides)
    features, quantiles, memory_mb = opts.features, opts.quantiles, opts.memory_mb
    executor, jobs, batch_rows, episodes = opts.executor, opts.jobs, opts.batch_rows, opts.episodes
    images = opts.images
    ds = as_dataset(root)
    if ds.version != V3:
        raise DatasetError(
            f"stats are written for v3.0 roots only (this one is {ds.version}); convert it first"
        )
    feats = numeric_features(ds.info, features)
    if not feats:
        raise DatasetError("no numeric one-dimensional features to compute stats for")
    if images:
        require_decoders(ds.info)  # before the numeric pass: a missing decoder fails at once
    file_ids = ds.column("file_id")
    if episodes is not None:
        file_ids = file_ids[np.isin(ds.column("episode_index"), np.asarray(episodes))]
    ids = sorted(set(file_ids.tolist()))
    rels = [ds.data_files[i] for i in ids]
    exact = quantiles == "exact"
    need = column_bytes(ds.info, feats, ds.num_frames)
    batch_rows = batch_rows or block_rows(ds.info, feats)
    if exact and need > memory_mb * 2**20:
        log.warning(
            "%s: the columns (%.0f MiB) exceed --memory-mb %g: dataset quantiles come from the "
            "rank summary (bound recorded)",
            ds.root,
            need / 2**20,
            memory_mb,
        )
        exact = False
    if episodes is not None:
        ds = _subset(ds, np.asarray(episodes))
    state = data_state(ds)  # before the pass: what the sidecar spilled as it goes records
    with (
        spill_folder("episodekit-stats-", opts.spill_dir) as tmp,
        SketchSpill(
            feats,
            ds.info,
            {"fingerprint": ds.fingerprint, "data_state": state},
            blocks.POINTS,  # the size the scan keeps (what the sidecar records)
            opts.spill_dir,
        ) as sketch_spill,
    ):
        spill = tmp if exact and executor == "local" else None
        common = {
            "root": ds.root,
            "features": feats,
            "points": int(opts.sketch_points),
            "batch_rows": int(batch_rows),
            "spill": spill,
            "pack": executor == "ray",  # the sketch points through Ray's store: compressed
        }
        todo = [{**common, "rel": r, "file_id": i} for r, i in zip(rels, ids)]
        fold = EpisodeFold(ds.column("episode_index"), feats, len(todo), opts.spill_dir)
        for i, r in imap_files(scan_file, todo, executor, jobs):
            if episodes is not None:
                r = _keep_episodes(r, np.asarray(episodes))
            _take(i, r, fold, sketch_spill)
            del r  # folded: its memory (in Ray's object store) can go
        per = fold.finish()
        dataset = _dataset_stats(feats, per, fold)
        if exact and spill is not None:
            for n in feats:
                exact_from_runs([p for r in fold.runs for p in r[n]], dataset[n])
        elif exact:
            exact_quantiles(ds.root, rels, feats, dataset, executor, jobs, batch_rows)
        del fold
        sketches = sketch_spill.finish()
    mode = {n: "exact" if exact else "sketch" for n in feats}
    return StatsResult(
        features=feats,
        episode_index=per.episode_index,
        episode_count=per.count,
        episode=per,
        dataset=dataset,
        mode=mode,
        rank_error={n: dataset[n].quantile_error / max(dataset[n].count, 1) for n in feats},
        fingerprint=ds.fingerprint,
        state=state,
        info=ds.info,
        images=compute_image_stats(ds, executor, jobs) if images else None,
        sketches=sketches,
    )


def _take(i: int, r: dict, fold: EpisodeFold, sketch_spill: SketchSpill) -> None:
    """File ``i``'s scan result folded and its sketch points spilled, a block at a time. Nothing
    of ``r`` outlives the call: with Ray its arrays view the result's object in the store, and
    a view left in a variable would keep that object (mapped by this process) alive while the
    next result is awaited."""
    ep, count = np.asarray(r["episodes"], np.int64), np.asarray(r["count"], np.int64)
    points = {n: f.pop("points") for n, f in r["features"].items()}
    start = 0
    for b, m in enumerate(r["block_episodes"]):  # on disk as it comes: a group a block
        part = {n: unpack(p[b]) for n, p in points.items()}
        sketch_spill.add(
            EpisodeSketches(ep[start : start + m], count[start : start + m], part, blocks.POINTS)
        )
        start += m
    fold.add(i, r)


def _keep_episodes(r: dict, keep: np.ndarray) -> dict:
    """A scan result restricted to some episodes (summaries rebuilt from per-episode data is not
    possible, so the subset path only supports whole files; see compute_stats)."""
    sel = np.isin(r["episodes"], keep)
    if sel.all():
        return r
    raise DatasetError("episodes= must select whole data files (the bench splits by file)")


def _subset(ds: Dataset, keep: np.ndarray) -> Dataset:
    sel = np.isin(ds.column("episode_index"), keep)
    return Dataset(
        ds.root, ds.fs, ds.path, ds.info, ds.tasks, ds.episodes.filter(pa.array(sel)), ds.data_files
    )


def refine_quantiles(
    root: Dataset | str | os.PathLike,
    dataset: dict[str, FeatureStats],
    executor: str = "local",
    jobs: int | None = None,
    batch_rows: int | None = None,
) -> dict[str, FeatureStats]:
    """Exact quantiles for stats whose summaries cover exactly the frames of ``root`` (e.g. the
    :func:`merge_stats` of its halves): one pass over its data files, in place; returns ``dataset``.
    """
    ds = as_dataset(root)
    feats = {n: len(fs.sketches) for n, fs in dataset.items()}
    rows = batch_rows or block_rows(ds.info, feats)
    exact_quantiles(ds.root, list(ds.data_files), feats, dataset, executor, jobs, rows)
    return dataset
