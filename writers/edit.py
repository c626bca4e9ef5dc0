"""``episodekit edit``: a new dataset without some episodes, features or task names (never in
place), written by :func:`~episodekit.writers.writer.write_dataset`."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field, replace

import numpy as np

from episodekit.core.dataset import Dataset, open_dataset
from episodekit.core.paths import DEFAULT_TARGET_MB
from episodekit.core.words import plural
from episodekit.validate.flagged import flagged_frames
from episodekit.writers import select
from episodekit.writers.features import FeatureChanges, feature_changes
from episodekit.writers.frames import (
    DEFAULT_IDLE_THRESHOLD,
    combine,
    dropped_ranges,
    find_idle,
    range_masks,
    selection_digest,
)
from episodekit.writers.image_video import chosen_keys
from episodekit.writers.sources import source_episodes
from episodekit.writers.writer import WriteOptions, WriteResult, write_dataset


@dataclass(frozen=True)
class EditSpec:
    """What to change. Episode lists are episode indices of the source."""

    drop_episodes: tuple[int, ...] | None = None
    keep_episodes: tuple[int, ...] | None = None
    drop_tasks: tuple[str, ...] = ()
    drop_flagged: tuple[str, ...] = ()
    report: str | None = None  # a validate --json report for drop_flagged (else a fresh run)
    remove_features: tuple[str, ...] = ()
    rename_tasks: tuple[tuple[str, str], ...] = ()
    target_mb: float = DEFAULT_TARGET_MB
    executor: str = "local"  # or "ray": data files written and verified as Ray tasks
    # frames cut inside episodes (writers/frames.py): (episode, start, end) rows, end exclusive
    drop_frames: np.ndarray | None = None
    keep_frames: np.ndarray | None = None
    trim_idle: bool = False
    idle_threshold: float = DEFAULT_IDLE_THRESHOLD
    lossless_only: bool = False  # video cuts by packet copy only (no GOP re-encoded)
    # features added from files (name, path) and renamed (old, new): writers/features.py
    add_features: tuple[tuple[str, str], ...] = ()
    rename_features: tuple[tuple[str, str], ...] = ()
    # image features encoded as video ("all": every one): writers/image_video.py
    images_to_video: tuple[str, ...] = ()
    # added values may be NaN or inf (written as given; validate then reports data.nan)
    allow_nan: bool = False


@dataclass
class EditResult:
    """The write's result plus what was dropped and why (whole episodes, and frames per
    episode cut inside)."""

    write: WriteResult
    dropped: dict[int, str] = field(default_factory=dict)
    frames: dict[int, dict] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what the user should know (--allow-nan)

    def as_dict(self) -> dict:
        d = self.write.as_dict()
        d["dropped"] = {str(k): v for k, v in sorted(self.dropped.items())}
        if self.frames:  # only when frames were cut inside episodes: the summary as before
            d["frames_dropped"] = {str(k): v for k, v in sorted(self.frames.items())}
        if self.notes:
            d["notes"] = list(self.notes)
        return d


def edit(root: str, out: str | os.PathLike, spec: EditSpec) -> EditResult:
    """Write ``root`` with ``spec`` applied to ``out`` (see :class:`EditSpec`)."""
    ds = open_dataset(root)
    for old, _new in spec.rename_tasks:
        if old not in ds.task_strings():
            raise ValueError(f"--rename-task {old}=...: no task {old!r} in {root}")
    flagged, flagged_ranges = None, {}
    if spec.drop_flagged:  # whole episodes, and the frames of frame-level findings
        flagged, flagged_ranges = flagged_frames(
            root, list(spec.drop_flagged), spec.report, ds.fingerprint
        )
    kept, dropped = select.choose(
        ds,
        drop=list(spec.drop_episodes) if spec.drop_episodes is not None else None,
        keep=list(spec.keep_episodes) if spec.keep_episodes is not None else None,
        drop_tasks=list(spec.drop_tasks),
        flagged=flagged,
    )
    changes = _feature_changes(ds, spec)
    to_video = chosen_keys(ds, spec.images_to_video, spec.remove_features)
    masks, report = _frame_masks(ds, spec, kept, flagged_ranges)
    for e, info in report.items():
        if info.get("all"):
            dropped[e] = "all frames dropped by " + ",".join(info["by"])
    kept = np.array([e for e in kept.tolist() if e not in dropped], dtype=np.int64)
    changes.require(kept, masks, spec.allow_nan)  # the kept frames' values: before any write
    extra = (("frames", selection_digest(masks)),) if masks else ()
    if changes:
        extra += (("features", changes.digest()),)
    options = WriteOptions(
        what="episodekit edit",
        remove_features=tuple(spec.remove_features),
        rename_tasks=tuple(spec.rename_tasks),
        target_mb=spec.target_mb,
        extra=extra + ((("video_cut", "lossless"),) if spec.lossless_only else ()),
        executor=spec.executor,
        changes=changes or None,
        images_to_video=to_video,
    )
    sources = [
        replace(s, frames=masks[s.episode_index]) if s.episode_index in masks else s
        for s in source_episodes(ds, kept)
    ]
    notes = [
        f"--add-feature {a.name}: {plural(a.nonfinite, 'kept frame')} with NaN or inf written "
        "as given (--allow-nan): its stats hold NaN, validate reports data.nan and stats.finite"
        for a in changes.added
        if a.nonfinite
    ]
    # NaN values allowed: numpy's warnings on their stats (NaN, as LeRobot computes them) are noise
    quiet = np.errstate(all="ignore") if notes else contextlib.nullcontext()
    with quiet:
        result = write_dataset(sources, out, options)
    frames = {e: r for e, r in report.items() if not r.get("all")}
    return EditResult(result, dropped, frames, notes)


def _feature_changes(ds: Dataset, spec: EditSpec) -> FeatureChanges:
    """The features ``spec`` adds (values read and checked now) and renames."""
    return feature_changes(
        ds, list(spec.add_features), list(spec.rename_features), spec.remove_features
    )


def _frame_masks(
    ds: Dataset, spec: EditSpec, kept: np.ndarray, flagged: dict | None = None
) -> tuple[dict[int, np.ndarray], dict[int, dict]]:
    """The kept-frame mask of every kept episode cut inside, and per such episode what went
    (``dropped`` frames, ``ranges`` [first, last], ``by`` which options, ``head``/``tail`` of
    --trim-idle, ``flagged_by`` the checks of --drop-flagged, ``all`` when nothing is left).
    ``flagged``: ``{episode: ([[first, last], ...], [check, ...])}`` of --drop-flagged."""
    parts: list[tuple[str, dict[int, np.ndarray]]] = []
    if flagged:
        rows = [(e, a, b + 1) for e, (ranges, _) in flagged.items() for a, b in ranges]
        ranges = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
        parts.append(("--drop-flagged", range_masks(ds, ranges, False, "--drop-flagged")))
    if spec.drop_frames is not None:
        parts.append(("--drop-frames", range_masks(ds, spec.drop_frames, False, "--drop-frames")))
    if spec.keep_frames is not None:
        parts.append(("--keep-frames", range_masks(ds, spec.keep_frames, True, "--keep-frames")))
    idle = None
    if spec.trim_idle:
        idle = find_idle(ds, spec.idle_threshold)
        lengths = dict(zip(ds.column("episode_index").tolist(), ds.column("length").tolist()))
        parts.append(("--trim-idle", idle.masks(lengths)))
    keep = set(kept.tolist())
    masks = combine([{e: m for e, m in p.items() if e in keep} for _, p in parts])
    report: dict[int, dict] = {}
    for e, mask in sorted(masks.items()):
        if mask.all():
            continue
        by = [name for name, p in parts if e in p and not p[e].all()]
        info: dict = {"dropped": int(np.count_nonzero(~mask)), "ranges": dropped_ranges(mask)}
        info["by"] = by
        if flagged and e in flagged and "--drop-flagged" in by:
            info["flagged_by"] = flagged[e][1]
        if idle is not None and (e in idle.head or e in idle.tail):
            info["head"], info["tail"] = idle.head.get(e, 0), idle.tail.get(e, 0)
        if not mask.any():
            info["all"] = True
        report[e] = info
    if idle is not None:
        for e in idle.still:
            if e in keep:
                report.setdefault(e, {"dropped": 0, "ranges": [], "by": []})
                report[e]["still"] = "never moves: kept whole by --trim-idle"
    return {e: m for e, m in masks.items() if not m.all() and m.any()}, report
