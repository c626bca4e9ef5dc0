"""Where each output episode goes: output data file (LeRobot's roll-over at
``data_files_size_in_mb``), row group (episode-aligned, ~32 MiB, ``prep``'s plan) and new numbering.

Sizes are estimated from the source footers, never by reading rows: an episode's on-disk bytes
are its share (by rows) of its source file's size, its uncompressed bytes its share of the
file's uncompressed bytes, scaled to the plain encoding the output uses (``plain_scale``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from episodekit.core.band import plan_row_groups
from episodekit.core.dataset import Dataset
from episodekit.core.footer import FileLayout, file_layout
from episodekit.core.layout.files import roll_over
from episodekit.core.memory import release_memory
from episodekit.core.parquet_read import open_data_file
from episodekit.core.parquet_write import plain_scale
from episodekit.core.paths import MIB
from episodekit.writers.sources import SourceEpisode


@dataclass
class OutputPlan:
    """Per output episode (arrays of one entry each, in output order) plus the source files."""

    datasets: list[Dataset]
    ds_id: np.ndarray  # index into ``datasets``
    row: np.ndarray  # row in that dataset's episodes table
    src_episode: np.ndarray  # source episode_index
    src_file: np.ndarray  # source data file id (``Dataset.data_files``)
    length: np.ndarray
    from_index: np.ndarray  # new dataset_from_index
    file_seq: np.ndarray  # output data file number (chunk = seq // chunks_size)
    group_rows: dict[int, np.ndarray] = field(default_factory=dict)  # file seq -> rows per group
    layouts: dict[tuple[int, int], FileLayout] = field(default_factory=dict)
    # output position -> kept-frame mask over its source episode (episodes cut inside)
    frames: dict[int, np.ndarray] = field(default_factory=dict)
    changes: Any = None  # added/renamed features (writers/features.py FeatureChanges)
    # episodes whose stats the data stage computes as it writes them (writers/stream_stats.py)
    stream: Any = None

    @property
    def num_episodes(self) -> int:
        return len(self.length)

    @property
    def num_frames(self) -> int:
        return int(self.length.sum())

    def runs(self, file_seq: int) -> list[tuple[int, int, np.ndarray]]:
        """``(ds_id, src_file, positions)``: maximal runs of consecutive output episodes of
        output file ``file_seq`` read from one source file."""
        pos = np.flatnonzero(self.file_seq == file_seq)
        key = self.ds_id[pos].astype(np.int64) * (1 << 32) + self.src_file[pos]
        cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
        return [(int(self.ds_id[p[0]]), int(self.src_file[p[0]]), p) for p in np.split(pos, cuts)]


def _check_order(ds_id: np.ndarray, src_episode: np.ndarray) -> None:
    for d in np.unique(ds_id).tolist():
        eps = src_episode[ds_id == d]
        if np.any(eps[1:] <= eps[:-1]):
            raise ValueError("the episodes of one source must come in ascending order, each once")


def plan_output(
    sources: list[SourceEpisode], target_bytes: int, file_limit_mb: float
) -> OutputPlan:
    """Plan the output data files and row groups of ``sources`` (see the module docstring)."""
    if not sources:
        raise ValueError("no episodes to write (the selection is empty)")
    datasets: list[Dataset] = []
    ids: dict[int, int] = {}
    for s in sources:
        ids.setdefault(id(s.ds), len(ids))
        if len(datasets) < len(ids):
            datasets.append(s.ds)
    ds_id = np.array([ids[id(s.ds)] for s in sources], dtype=np.int64)
    row = np.array([s.row for s in sources], dtype=np.int64)
    src_episode, src_file, length = (np.zeros(len(sources), dtype=np.int64) for _ in range(3))
    for d, ds in enumerate(datasets):
        sel = ds_id == d
        src_episode[sel] = ds.column("episode_index")[row[sel]]
        src_file[sel] = ds.column("file_id")[row[sel]]
        length[sel] = ds.column("length")[row[sel]]
    _check_order(ds_id, src_episode)
    cut = {i: s.frames for i, s in enumerate(sources) if s.frames is not None}
    for i, mask in cut.items():  # episodes cut inside (writers/frames.py)
        length[i] = int(np.count_nonzero(mask))
    plan = OutputPlan(
        datasets=datasets,
        ds_id=ds_id,
        row=row,
        src_episode=src_episode,
        src_file=src_file,
        length=length,
        from_index=np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64),
        file_seq=np.zeros(len(sources), dtype=np.int64),
        frames=cut,
    )
    disk, plain = _byte_estimates(plan)
    plan.file_seq = roll_over(disk, file_limit_mb * MIB)
    for f in np.unique(plan.file_seq).tolist():
        sel = np.flatnonzero(plan.file_seq == f)
        per_group = plan_row_groups(plain[sel], target_bytes)
        bounds = np.concatenate([[0], np.cumsum(per_group)])
        lengths = length[sel]
        plan.group_rows[f] = np.array(
            [int(lengths[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:])], dtype=np.int64
        )
    return plan


def _byte_estimates(plan: OutputPlan) -> tuple[np.ndarray, np.ndarray]:
    """On-disk and plain uncompressed bytes per output episode, from the source footers."""
    disk = np.zeros(plan.num_episodes)
    plain = np.zeros(plan.num_episodes)
    scale: dict[int, float] = {}
    pairs = np.unique(np.stack([plan.ds_id, plan.src_file], axis=1), axis=0).tolist()
    layouts = _one_episode_layouts(plan, pairs) or _footers(plan, pairs)
    plan.layouts.update(zip(map(tuple, pairs), layouts))
    for d, f in pairs:
        ds = plan.datasets[d]
        path = ds.data_path(f)
        layout = plan.layouts[(d, f)]
        if d not in scale:
            with open_data_file(path, ds.fs, stream=True) as df:
                scale[d] = plain_scale(df, layout, layout.batch_rows())
        sel = (plan.ds_id == d) & (plan.src_file == f)
        rows = max(1, layout.num_rows)
        disk[sel] = plan.length[sel] * layout.file_size / rows
        plain[sel] = plan.length[sel] * layout.row_group_bytes.sum() / rows * scale[d]
    return disk, plain


def _one_episode_layouts(plan: OutputPlan, pairs: list[list[int]]) -> list[FileLayout] | None:
    """Local v2.x roots keep one episode per file: their layouts from the episodes table (rows)
    and the file system (sizes), with one footer per dataset for the codec and bytes per row,
    instead of 10,000 footers. None when a source is not such a root (or not local). The rows
    read are still counted against the episodes table while copying (``kept_batches``)."""
    from dataclasses import replace

    from episodekit.core.dataset import V2

    if not all(plan.datasets[d].version in V2 and plan.datasets[d].is_local for d, _ in pairs):
        return None
    key = plan.ds_id.astype(np.int64) * (1 << 32) + plan.src_file
    pair_keys = np.array([d * (1 << 32) + f for d, f in pairs], dtype=np.int64)
    rows = np.bincount(np.searchsorted(pair_keys, key), plan.length, minlength=len(pairs))
    samples: dict[int, FileLayout] = {}
    out = []
    for (d, f), n in zip(pairs, rows.astype(np.int64).tolist()):
        ds = plan.datasets[d]
        path = ds.data_path(f)
        if d not in samples:
            samples[d] = file_layout(path)
        first = samples[d]
        per_row = first.row_group_bytes.sum() / max(first.num_rows, 1)
        size = os.path.getsize(path)
        out.append(
            replace(
                first,
                path=path,
                num_rows=n,
                file_size=size,
                row_group_rows=np.array([n], dtype=np.int64),
                row_group_bytes=np.array([int(n * per_row)], dtype=np.int64),
                row_group_compressed=np.array([size], dtype=np.int64),
                episode_min=None,  # read every row group of the file
                episode_max=None,
            )
        )
    return out


FOOTER_THREADS = 8  # footers are small reads: threads hide the latency of many files (v2.x)
FOOTER_BATCH = 1024  # footers read between two releases of freed memory


def _footers(plan: OutputPlan, pairs: list[list[int]]) -> list[FileLayout]:
    """The layouts of the source files ``pairs`` ((dataset, file) each), read by a few threads:
    a v2.x root has one file per episode, and one footer after another is most of the time."""
    from concurrent.futures import ThreadPoolExecutor

    def one(pair: list[int]) -> FileLayout:
        ds = plan.datasets[pair[0]]
        return file_layout(ds.data_path(pair[1]), None if ds.is_local else ds.fs)

    if len(pairs) < 2 * FOOTER_THREADS:
        return [one(p) for p in pairs]
    out: list[FileLayout] = []
    with ThreadPoolExecutor(FOOTER_THREADS) as pool:
        for i in range(0, len(pairs), FOOTER_BATCH):
            out += pool.map(one, pairs[i : i + FOOTER_BATCH])
            release_memory()  # a parsed footer's freed memory stays in the heap otherwise
    return out
