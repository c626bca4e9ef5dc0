"""``episodekit convert``: a v2.1 or v2.0 root to LeRobot v3.0, in one verified pass.

v2.x keeps one parquet and one mp4 per episode and its metadata in ``meta/*.jsonl``; LeRobot
reads only v3.0 since 0.4. The conversion is the surgery writer
(:func:`~episodekit.writers.writer.write_dataset`) with every episode kept: rows streamed
into ``data/chunk-XXX/file-XXX.parquet`` files of about ``data_mb`` MB in 32 MiB episode-aligned
row groups with page index (what ``prepare`` writes, so its row-group step then skips), each
camera's episodes joined by packet copy into mp4s of about ``video_mb`` MB (no re-encode;
``from/to_timestamp`` from the packets), episodes and tasks tables in v3.0 form, stats carried
over from ``episodes_stats.jsonl`` (computed where a source has none, and with
``stats="complete"`` also v2.1's missing quantiles: :mod:`~episodekit.writers.stats_fill`).
Verified (row counts, per-column checksums per source file, video frame counts) before an
atomic publish into ``--out``; resumable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from episodekit.core.dataset import V2, open_dataset
from episodekit.core.paths import DEFAULT_TARGET_MB, MAX_TARGET_MB
from episodekit.writers.sources import source_episodes
from episodekit.writers.writer import WriteOptions, WriteResult, write_dataset


@dataclass(frozen=True)
class ConvertOptions:
    """File sizes of the output (LeRobot's defaults: 100 MB data, 200 MB video files) and the
    row-group target."""

    data_mb: float = 100.0
    video_mb: float = 200.0
    target_mb: float = DEFAULT_TARGET_MB
    stats: str = "carry"  # or "complete": also compute what v2.1 lacks (the quantiles)
    executor: str = "local"  # or "ray": the data files written and verified as Ray tasks

    def check(self) -> None:
        for name in ("data_mb", "video_mb", "target_mb"):
            if not 0 < getattr(self, name) <= MAX_TARGET_MB:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0 and <= {MAX_TARGET_MB:g}")
        if self.stats not in ("carry", "complete"):
            raise ValueError(f"--stats must be carry or complete, got {self.stats!r}")


def convert(
    root: str, out: str | os.PathLike, options: ConvertOptions | None = None
) -> WriteResult:
    """Write the v2.x dataset ``root`` as a new v3.0 dataset at ``out`` (never in place)."""
    o = options or ConvertOptions()
    o.check()
    ds = open_dataset(root)
    if ds.version not in V2:
        raise ValueError(
            f"{root} is already {ds.version}: nothing to convert "
            f"(prepare it with `episodekit prepare {root}`)"
        )
    write = WriteOptions(
        what="episodekit convert",
        target_mb=o.target_mb,
        info_overrides=(
            ("data_files_size_in_mb", o.data_mb),
            ("video_files_size_in_mb", o.video_mb),
        ),
        fill_stats="complete" if o.stats == "complete" else "missing",
        executor=o.executor,
    )
    return write_dataset(source_episodes(ds), out, write)


def push_output(
    out: str | os.PathLike, repo: str, api: object = None, revision: str | None = None
) -> object:
    """Upload every file of the converted dataset ``out`` (not episodekit's own markers and
    lock) to the dataset repo ``repo`` in one commit (on ``revision``, e.g. a ``v3.0`` branch)."""
    from pathlib import Path

    from episodekit.core.hub import push_files

    root = Path(out)
    files = [
        p.relative_to(root).as_posix()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".episodekit")
    ]
    return push_files(root, files, repo, api=api, revision=revision, message="episodekit convert")
