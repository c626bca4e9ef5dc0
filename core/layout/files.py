"""Where the files of a v3.0 root go: LeRobot's file roll-over rule (which episodes share a
file), the chunk numbering of a file sequence and the path of a file from its template. Every
writer of the layout (surgery, repair, sample) numbers its files here."""

from __future__ import annotations

import numpy as np

from episodekit.core.paths import format_template


def roll_over(byte_sizes: np.ndarray, limit_bytes: float) -> np.ndarray:
    """File number per episode (LeRobot's rule: an episode goes to the current file unless that
    file already reached the limit; a file is never empty, so one episode over the limit gets a
    file of its own). A loop per episode, not per frame: each decision depends on the last."""
    file_of = np.zeros(len(byte_sizes), dtype=np.int64)
    current, acc = 0, 0.0
    for i, b in enumerate(np.asarray(byte_sizes, dtype=np.float64).tolist()):
        if acc > 0 and acc + b > limit_bytes:
            current, acc = current + 1, 0.0
        file_of[i] = current
        acc += b
    return file_of


def chunk_file(index, chunks_size: int):
    """``(chunk_index, file_index)`` of file number ``index`` (an int or an integer array): LeRobot
    puts ``chunks_size`` files in a chunk folder, numbered from 0 in each."""
    if chunks_size <= 0:
        raise ValueError(f"chunks_size must be a positive integer, got {chunks_size}")
    return index // chunks_size, index % chunks_size


def file_path(
    template: str, chunk_index: int, file_index: int, video_key: str | None = None
) -> str:
    """The relative path of one file from a v3.0 template (``data_path``, ``video_path``, the
    episodes files'), formatted safely (:func:`episodekit.core.paths.format_template`)."""
    fields: dict[str, object] = {"chunk_index": chunk_index, "file_index": file_index}
    if video_key is not None:
        fields["video_key"] = video_key
    return format_template(template, **fields)
