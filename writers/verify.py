"""Check a staged output before it is published: every data file streamed back by the episode
sink's read-back (:func:`~episodekit.writers.sink_data.read_back`: row count, row groups as
planned, schema with its metadata, ``index`` and ``episode_index`` as renumbered, per-column
checksums equal to those of the kept source rows), the staged root read back as a dataset
(totals, ranges, files), and each video file's frame count against its episodes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from episodekit.core.dataset import open_dataset
from episodekit.core.executor import imap_files
from episodekit.core.parquet_write import VerificationError
from episodekit.writers.data import DataResult
from episodekit.writers.plan import OutputPlan
from episodekit.writers.sink_data import read_back


def verify_data(
    staging: Path, plan: OutputPlan, result: DataResult, executor: str = "local"
) -> None:
    """Stream every written data file back (one job per file, as the files were written) and
    compare it with what was meant; raise :class:`VerificationError` naming the file and the
    difference."""
    files = sorted(result.files)
    starts = np.cumsum([0] + [int(np.sum(plan.group_rows[f])) for f in files])
    if starts[-1] != plan.num_frames:
        msg = f"planned {starts[-1]} rows, the kept episodes have {plan.num_frames}"
        raise VerificationError(msg)
    jobs = [(f, int(a), int(b)) for f, a, b in zip(files, starts, starts[1:])]
    shared = (str(staging), plan, result)
    workers = 1 if executor == "local" else None
    for _ in imap_files(_verify_file, jobs, executor, workers, shared=shared):
        pass


def _verify_file(job: tuple[int, int, int], shared: tuple) -> None:
    """One written data file (its output rows ``[row, end)``) against the plan and its source
    rows' checksums (:func:`~episodekit.writers.sink_data.read_back`: the sink's read-back)."""
    (f, row, end), (staging, plan, result) = job, shared
    rel = result.files[f]
    expect_ep = _episode_of_rows(plan.from_index, plan.length, row, end)

    def episodes(batch, at: int) -> None:
        ep = batch.column("episode_index").to_numpy()
        if not np.array_equal(ep, expect_ep[at : at + batch.num_rows]):
            raise VerificationError(f"{rel}: episode_index differs from the episodes")

    read_back(
        staging,
        rel,
        result.schema,
        result.checksums[f],
        end - row,
        first=row,  # its digests: every column but the renumbered ones (data.RENUMBERED)
        check_metadata=True,
        group_rows=plan.group_rows[f],
        each=episodes,
    )


def _episode_of_rows(start: np.ndarray, length: np.ndarray, row: int, end: int) -> np.ndarray:
    """The output episode of each row in ``[row, end)`` (only those rows, not every frame),
    from the episodes' first rows and lengths."""
    stop = start + length
    first = int(np.searchsorted(stop, row, side="right"))
    last = int(np.searchsorted(start, end, side="left"))
    lo = np.maximum(start[first:last], row)
    hi = np.minimum(stop[first:last], end)
    return np.repeat(np.arange(first, last), np.maximum(hi - lo, 0))


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
