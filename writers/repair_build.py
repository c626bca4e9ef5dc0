"""The files ``episodekit repair`` writes into its staging folder, from a
:class:`~episodekit.writers.repair_plan.RepairPlan`; files it keeps as they are are only listed.

- data files: a footer-less one is its whole row groups up to the last kept episode under a new
  footer (bytes copied, nothing decoded: :func:`~episodekit.core.parquet_salvage.write_salvaged`);
  one that must lose rows inside it is rewritten from its kept rows by the episode sink's data
  files (:class:`~episodekit.writers.sink_data.DataFiles`: one row group per episode, as the
  recorder writes) and read back against their checksums;
- ``meta/episodes``: recovered rows as they were, rebuilt rows
  (:mod:`episodekit.writers.repair_meta`), written a block of rows at a time
  (:mod:`episodekit.writers.repair_episodes`);
- an mp4 with frames after its last kept episode (the unsaved one's, or a cut-off tail) is cut
  by packet copy (:func:`~episodekit.prep.remux.remux`);
- info.json totals and splits (and the keys :mod:`~episodekit.writers.repair_info` rebuilt;
  never a number that is not finite), tasks.parquet without tasks no kept episode uses, stats.json
  when the old one disagrees with the kept episodes (LeRobot's aggregation of their stats),
  written through the sink's metadata side (:mod:`episodekit.writers.sink_meta`, policy
  ``REPAIR``: the recorder's places of the episodes rows, exact quantiles).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core import parquet_salvage as ps
from episodekit.core import thrift_compact as tc
from episodekit.core.atomic import atomic_path
from episodekit.core.parquet_read import read_table
from episodekit.core.parquet_write import write_table
from episodekit.metadata.stats import QUANTILE_KEYS, numeric_features
from episodekit.metadata.stats.range_counts import RangeCounts
from episodekit.writers import repair_episodes, repair_info, sink_meta
from episodekit.writers.repair_kept import column, files_of
from episodekit.writers.repair_plan import RepairPlan
from episodekit.writers.sink_data import RECORDER, DataFiles

REWRITE = replace(RECORDER, verify=True)  # a rewritten data file: the recorder's, read back

INFO, STATS, TASKS = "meta/info.json", "meta/stats.json", "meta/tasks.parquet"
SELECT_ROWS = 65_536  # rows a read of the quantiles' selection pass (over the kept data files)


@dataclass
class Staged:
    """What a build did: files written (relative path -> how), files the output takes from the
    root unchanged, root files the output leaves out, episodes whose metadata was rebuilt, and
    the data files written under a new footer (relative path -> salvage, template: the
    verification reads them a window of row groups at a time)."""

    written: dict[str, str] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    rebuilt: list[int] = field(default_factory=list)
    salvaged: dict[str, tuple[ps.Salvage, tc.Struct]] = field(default_factory=dict)


def _dest(staging: Path, rel: str) -> Path:
    path = staging / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _prefix(df, runs: list[int]) -> ps.Salvage | None:
    """The salvage of ``df`` cut to its first ``len(runs)`` episodes, when those are its first
    runs and end on a row-group boundary (else None)."""
    if runs != list(range(len(runs))) or not df.group_end[runs[-1]]:
        return None
    rows = int(df.rows[: len(runs)].sum())
    ends = np.cumsum(df.salvage.row_groups.rows())
    groups = int(np.searchsorted(ends, rows)) + 1
    if groups == len(df.salvage.row_groups):  # every group: the salvage itself, not a copy
        return df.salvage
    return replace(df.salvage, row_groups=df.salvage.row_groups[:groups])


def _rewrite(plan: RepairPlan, df, runs: list[int], staging: Path) -> None:
    """``df`` without the rows of dropped episodes, at its own path under ``staging``, through
    the episode sink's data files: one row group per kept episode in LeRobot's encoding (as its
    recorder writes; ``runs``: the kept ones' runs in ``df``), then read back against the
    checksums of the rows written (repair's own verification checks the rows' ``index`` and
    episodes, not their values)."""
    root = plan.inventory.root
    ends = np.cumsum(df.group_rows(root))
    files = DataFiles(staging, df.schema(root), policy=REWRITE)
    files.open_file(df.file, None, rel=df.rel)  # index: the rows' own (dropped ones leave gaps)
    try:
        for run in runs:
            a, n = int(df.first_row[run]), int(df.rows[run])
            files.write(df.read_rows(root, a, n, ends=ends))
        files.close()
    except BaseException:
        files.abort()
        raise
    files.verify(df.rel)


def build_data(plan: RepairPlan, staging: Path, staged: Staged) -> None:
    root = plan.inventory.root
    where = files_of(plan.kept, plan.inventory.data)  # columns: no Episode held per episode
    run_of = column(plan.kept, "run")
    for f, df in enumerate(plan.inventory.data):
        runs = run_of[where == f].tolist()
        if not runs:
            staged.removed.append(df.rel)
        elif df.intact and runs == list(range(len(df.episode))):
            staged.unchanged.append(df.rel)
        elif not df.intact and (cut := _prefix(df, runs)) is not None:
            ps.write_salvaged(root / df.rel, _dest(staging, df.rel), cut, df.template)
            staged.salvaged[df.rel] = (cut, df.template)
            staged.written[df.rel] = f"new footer over {len(cut.row_groups)} whole row groups"
        else:
            _rewrite(plan, df, runs, staging)
            staged.written[df.rel] = f"rewritten with the rows of {len(runs)} kept episodes"


def build_videos(plan: RepairPlan, staging: Path, staged: Staged) -> None:
    from episodekit.prep.remux import Segment, remux

    root = plan.inventory.root
    for key, files in plan.inventory.videos.items():
        for v in files:
            ends = [e.videos[key][3] for e in plan.kept if e.videos[key][:2] == (v.chunk, v.file)]
            if not ends:
                staged.removed.append(v.rel)
                continue
            end = max(ends)
            half = 0.5 * v.frame_ticks * v.time_base
            used = int(np.searchsorted(v.pts * v.time_base, end - half))
            if used == v.frames:
                staged.unchanged.append(v.rel)
                continue
            remux([Segment(str(root / v.rel), 0.0, end)], _dest(staging, v.rel))
            extra = v.frames - used
            staged.written[v.rel] = f"cut after its last kept episode ({extra} frames dropped)"


def build_tables(plan: RepairPlan, staging: Path, staged: Staged) -> None:
    """tasks.parquet and info.json (stats.json comes last: :func:`build_stats`)."""
    inv = plan.inventory
    if inv.tasks_raw is not None and not inv.tasks_problem:
        if len(plan.tasks) == inv.tasks_raw.num_rows:
            staged.unchanged.append(TASKS)
        else:
            keep = inv.tasks_raw["task_index"].to_numpy() < len(plan.tasks)
            sink_meta.write_tasks(staging, inv.tasks_raw.filter(pa.array(keep)))
            staged.written[TASKS] = f"{len(plan.tasks)} tasks"
    else:
        sink_meta.write_tasks(staging, plan.tasks)
        staged.written[TASKS] = f"{len(plan.tasks)} tasks (rebuilt)"
    info = dict(inv.info)  # damaged keys already rebuilt (repair_info)
    info.update(
        total_episodes=len(plan.kept),
        total_frames=plan.frames,
        total_tasks=len(plan.tasks),
        splits={"train": f"0:{len(plan.kept)}"},
    )
    old = inv.info_on_disk
    if info == old:
        staged.unchanged.append(INFO)
        return
    try:
        sink_meta.write_info(staging, info)
    except ValueError as exc:  # a check of repair_info missed a key: never publish it
        refused = f"would hold a number that is not finite ({exc})"
        raise repair_info.InfoRefused(refused, INFO) from exc
    if old is None:
        staged.written[INFO] = "rebuilt from the data (every key)"
        return
    changed = [k for k in info if k not in old or old[k] != info[k]]
    changed += [k for k in old if k not in info]
    totals = {"total_episodes", "total_frames", "total_tasks", "splits"}
    others = [k for k in changed if k not in totals]
    how = f"rebuilt {', '.join(others)}" if others else ""
    if len(others) < len(changed):
        how = f"{how}; totals and splits" if how else "totals and splits"
    staged.written[INFO] = how


def value_ranges(plan: RepairPlan, stats: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per numeric feature with quantile keys, the kept episodes' min and max per dimension
    (from their own stats): the range the verification counts its values over. A feature
    whose range is not finite is left out (its quantiles come from a pass of their own)."""
    out = {}
    for name, dims in numeric_features(plan.inventory.info).items():
        st = stats.get(name) or {}
        if not any(k in st for k in QUANTILE_KEYS) or "min" not in st or "max" not in st:
            continue
        lo = np.asarray(st["min"], np.float64).reshape(-1)
        hi = np.asarray(st["max"], np.float64).reshape(-1)
        if len(lo) == len(hi) == dims and np.isfinite(lo).all() and np.isfinite(hi).all():
            out[name] = (lo, np.maximum(lo, hi))
    return out


def build_stats(
    plan: RepairPlan,
    staging: Path,
    staged: Staged,
    stats: dict,
    counts: dict[str, RangeCounts] | None = None,
) -> None:
    """stats.json (also when the old one agrees with the kept episodes): ``stats``
    (:func:`lerobot_stats`) with every quantile key of a numeric feature exact over the kept
    data: selected in one pass from the verification's ``counts``
    (:mod:`episodekit.metadata.stats.range_counts`); a feature they lack (a range that is
    not finite, NaN values) by the stats pass (``compute_stats``). No sketch sidecar: it
    would cost a sort of every episode (``episodekit metadata stats`` writes one)."""
    feats = {
        n: d
        for n, d in numeric_features(plan.inventory.info).items()
        if any(k in (stats.get(n) or {}) for k in QUANTILE_KEYS)
    }
    data = plan.inventory.data
    rels = sorted({data[f].rel for f in np.unique(files_of(plan.kept, data)).tolist()})
    # a file under a new footer is read by windows of row groups (staged.salvaged)
    sink_meta.finish_stats(
        staging, stats, sink_meta.REPAIR, rels, feats, counts or {}, staged.salvaged,
        batch_rows=SELECT_ROWS,
    )  # fmt: skip
    staged.written[STATS] = (
        f"recomputed for the {len(plan.kept)} kept episodes"
        if plan.stats_reason
        else "quantiles of the kept data (LeRobot's are a mean of the episodes')"
    )


def build(plan: RepairPlan, staging: Path) -> tuple[Staged, dict]:
    """Every changed file of the output under ``staging``, except stats.json (see
    :func:`build_stats`, which needs the verified root); and what LeRobot's recorder writes in
    stats.json for the kept episodes (its aggregation of their per-episode stats, episode after
    episode, fed the metadata rows as they are written:
    :func:`~episodekit.writers.repair_episodes.build_episodes`; its quantiles are replaced by
    :func:`build_stats`)."""
    staged = Staged()
    build_data(plan, staging, staged)
    stats = repair_episodes.build_episodes(plan, staging, staged)
    build_videos(plan, staging, staged)
    build_tables(plan, staging, staged)
    staged.unchanged += plan.inventory.other
    staged.removed += _left_behind(plan)
    return staged, stats


def _left_behind(plan: RepairPlan) -> list[str]:
    """Staged PNGs and never-appended episode mp4s of the recorder (not in the output)."""
    inv = plan.inventory
    out = [
        p.relative_to(inv.root).as_posix()
        for p in sorted((inv.root / "images").rglob("*"))
        if p.is_file()
    ]
    out += [rel for cams in inv.temp_videos.values() for rel in cams.values()]
    return out


def contiguous_ranges(staging: Path) -> None:
    """Make ``dataset_from_index``/``to_index`` of the staged episodes files run on without
    gaps (dropped episodes leave some): what a root must hold to be read as one before the
    dataset writer renumbers it (the rows are found by ``episode_index``)."""
    files = sorted(staging.glob("meta/episodes/*/*.parquet"))
    start = 0
    for f in files:
        t = read_table(None, str(f))
        n = t["length"].to_numpy()
        frm = start + np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
        for name, values in (("dataset_from_index", frm), ("dataset_to_index", frm + n)):
            t = t.set_column(t.schema.get_field_index(name), name, pa.array(values))
        write_table(t, f)
        start += int(n.sum())


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (same filesystem), else a copy (atomic: ``dst`` is
    whole or absent, as a backup must be)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        import shutil

        with atomic_path(dst) as tmp:
            shutil.copyfile(src, tmp)
