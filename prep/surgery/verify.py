"""Check a staged output before it is published: every data file streamed back (row count, row
groups as planned, schema with its metadata, ``index`` and ``episode_index`` as renumbered,
per-column checksums equal to those of the kept source rows), the staged root read back as a
dataset (totals, ranges, files), and each video file's frame count against its episodes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from episodekit.core.dataset import open_dataset
from episodekit.prep.checksum import TableChecksum
from episodekit.prep.rewrite import VerificationError, _open_parquet
from episodekit.prep.surgery.data import RENUMBERED, DataResult
from episodekit.prep.surgery.plan import OutputPlan

READ_BATCH = 64 * 1024


def verify_data(staging: Path, plan: OutputPlan, result: DataResult) -> None:
    """Stream every written data file back and compare it with what was meant; raise
    :class:`VerificationError` naming the file and the difference."""
    written = TableChecksum()
    checked = [n for n in result.schema.names if n not in RENUMBERED]
    expect_ep = np.repeat(np.arange(plan.num_episodes), plan.length)
    row = 0
    for f, rel in sorted(result.files.items()):
        with _open_parquet(str(staging / rel), None) as pf:
            meta = pf.metadata
            rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            if not np.array_equal(rows, plan.group_rows[f]):
                raise VerificationError(f"{rel}: row groups {rows} differ from the plan")
            if not pf.schema_arrow.equals(result.schema, check_metadata=True):
                raise VerificationError(f"{rel}: schema differs from the source's")
            for batch in pf.iter_batches(batch_size=READ_BATCH):
                n = batch.num_rows
                idx = batch.column("index").to_numpy()
                ep = batch.column("episode_index").to_numpy()
                if not np.array_equal(idx, np.arange(row, row + n)):
                    raise VerificationError(f"{rel}: index is not renumbered 0..N-1 in order")
                if not np.array_equal(ep, expect_ep[row : row + n]):
                    raise VerificationError(f"{rel}: episode_index differs from the episodes")
                written.update(batch.select(checked))
                row += n
    if row != plan.num_frames:
        raise VerificationError(f"wrote {row} rows, the kept episodes have {plan.num_frames}")
    got, want = written.digests(), result.checksum.digests()
    bad = sorted(c for c in set(got) | set(want) if got.get(c) != want.get(c))
    if bad:
        raise VerificationError(f"values differ from the source rows in columns {bad}")


def verify_root(staging: Path, plan: OutputPlan) -> None:
    """The staged root reads back as a dataset with the planned episodes."""
    ds = open_dataset(str(staging))
    if ds.num_episodes != plan.num_episodes or ds.num_frames != plan.num_frames:
        raise VerificationError("the staged root's episodes differ from the plan")
    if not np.array_equal(ds.column("length"), plan.length):
        raise VerificationError("the staged root's episode lengths differ from the plan")


def verify_videos(staging: Path, frames: dict[str, dict[str, int]]) -> None:
    """Each written mp4 holds exactly the frames its episodes claim (``{rel: expected}``)."""
    from episodekit.core.video import probe  # PyAV: only for roots with videos

    for key, files in frames.items():
        for rel, expected in files.items():
            got = probe(str(staging / rel)).num_frames
            if got != expected:
                raise VerificationError(
                    f"{rel}: {got} frames, its episodes have {expected} ({key})"
                )
