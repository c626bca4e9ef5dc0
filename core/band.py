"""What a good data-file layout is, whether a file already has it, and how to cut a file into it.

A good layout: row groups of about ``target`` uncompressed bytes, cut only between episodes (an
episode larger than the target gets a group of its own), with the page index written. The same
definitions serve the rewrite (plan, idempotence) and validation (``row_group_band``,
``file_needs_rewrite``).
"""

from __future__ import annotations

import json

import numpy as np

from episodekit.core.footer import FileLayout
from episodekit.core.paths import MIB
from episodekit.core.version import __version__
from episodekit.core.words import plural

MARKER_KEY = "episodekit.prep"  # file key-value metadata written by the rewrite


def row_group_band(target_bytes: int) -> tuple[int, int]:
    """Accepted uncompressed row-group size ``(lo, hi)`` for a target: [target/2, 1.5 * target].

    Exceptions (see :func:`band_violations`): the last group of a file may be smaller, a group
    holding one episode may be larger, and a group just before such an oversized episode may be
    smaller (merging would cross ``hi``).
    """
    return int(target_bytes // 2), int(target_bytes * 3 // 2)


def make_marker(target_mb: float, compression: str) -> str:
    """The JSON recorded under :data:`MARKER_KEY` in every rewritten file."""
    return json.dumps(
        {"target_mb": float(target_mb), "compression": compression, "version": __version__},
        sort_keys=True,
    )


def read_marker(layout: FileLayout) -> dict | None:
    """The rewrite's marker of a file (None when absent or unreadable)."""
    raw = layout.key_value.get(MARKER_KEY)
    if not raw:
        return None
    try:
        marker = json.loads(raw)
    except ValueError:
        return None
    return marker if isinstance(marker, dict) else None


def band_violations(layout: FileLayout, target_bytes: int) -> list[str]:
    """Row groups of ``layout`` outside the band or splitting an episode (empty list: good)."""
    n = layout.num_row_groups
    if n == 0:
        return []
    if layout.episode_min is None or layout.episode_max is None:
        return ["no episode_index statistics in the footer"]
    lo, hi = row_group_band(target_bytes)
    b = layout.row_group_bytes
    single = layout.episode_min == layout.episode_max
    out = []
    split = np.flatnonzero(layout.episode_max[:-1] >= layout.episode_min[1:])
    if len(split):
        i = int(split[0])
        out.append(f"row groups {i} and {i + 1} share episode {int(layout.episode_min[i + 1])}")
    too_big = np.flatnonzero((b > hi) & ~single)
    if len(too_big):
        i = int(too_big[0])
        out.append(f"row group {i} has {b[i] / MIB:.1f} MiB > {hi / MIB:.1f} MiB")
    next_oversized = np.append((b[1:] > hi) & single[1:], False)
    is_last = np.arange(n) == n - 1
    too_small = np.flatnonzero((b < lo) & ~is_last & ~next_oversized)
    if len(too_small):
        i = int(too_small[0])
        out.append(
            f"{plural(len(too_small), 'row group')} below {lo / MIB:.1f} MiB "
            f"(row group {i} has {b[i] / MIB:.2f} MiB)"
        )
    return out


def file_needs_rewrite(
    layout: FileLayout, target_bytes: int, compression: str = "keep"
) -> str | None:
    """Why the file at ``layout`` needs a rewrite for ``target_bytes``; None when it is done.

    Done means: marked by a previous rewrite with the same target, or already episode-aligned,
    within :func:`row_group_band` and carrying a page index. Footer facts only. An explicit
    ``compression`` other than the file's own codec also asks for a rewrite.
    """
    if layout.num_rows == 0:
        return None
    if compression != "keep" and codec_name(layout.compression) != compression:
        return f"compression {layout.compression.lower()} != {compression}"
    marker = read_marker(layout)
    if marker is not None and marker.get("target_mb") == target_bytes / MIB:
        return None
    if not layout.has_page_index:
        return "no page index"
    problems = band_violations(layout, target_bytes)
    return "; ".join(problems) if problems else None


def codec_name(footer_codec: str) -> str:
    """Footer codec name (``SNAPPY``, ``ZSTD``, ``UNCOMPRESSED``...) -> pyarrow's writer name."""
    name = footer_codec.lower()
    return "none" if name == "uncompressed" else name


def plan_row_groups(episode_bytes: np.ndarray, target_bytes: int) -> np.ndarray:
    """Group consecutive episodes into row groups; return the number of episodes per group.

    Greedy in episode order: the next episode joins the open group while the group stays within
    ``target_bytes``, or while the group is still below the band's ``lo`` and stays below its
    ``hi``; an episode larger than that starts (and fills) its own group. A small tail group is
    merged into the previous one when the sum stays within ``hi``. One loop step per episode.
    """
    lo, hi = row_group_band(target_bytes)
    counts: list[int] = []
    sizes: list[float] = []
    acc, k = 0.0, 0
    for b in np.asarray(episode_bytes, dtype=np.float64).tolist():
        if k == 0 or acc + b <= target_bytes or (acc < lo and acc + b <= hi):
            acc, k = acc + b, k + 1
        else:
            counts.append(k)
            sizes.append(acc)
            acc, k = b, 1
    if k:
        counts.append(k)
        sizes.append(acc)
    if len(counts) > 1 and sizes[-1] < lo and sizes[-2] + sizes[-1] <= hi:
        tail = counts.pop()
        counts[-1] += tail
    return np.asarray(counts, dtype=np.int64)


def episode_byte_estimate(
    episode_starts: np.ndarray, num_rows: int, rg_rows: np.ndarray, rg_bytes: np.ndarray
) -> np.ndarray:
    """Uncompressed bytes per episode, prorated by rows within each source row group.

    ``episode_starts`` are the first row of each episode run (ascending, first is 0).
    """
    rg_start = np.concatenate([[0], np.cumsum(rg_rows)])
    cum_at_start = np.concatenate([[0.0], np.cumsum(rg_bytes, dtype=np.float64)])
    per_row = np.where(rg_rows > 0, rg_bytes / np.maximum(rg_rows, 1), 0.0)

    def cum_bytes(rows: np.ndarray) -> np.ndarray:
        g = np.clip(np.searchsorted(rg_start, rows, side="right") - 1, 0, len(rg_rows) - 1)
        return cum_at_start[g] + (rows - rg_start[g]) * per_row[g]

    bounds = np.append(np.asarray(episode_starts, dtype=np.int64), num_rows)
    at = cum_bytes(bounds)
    at[-1] = cum_at_start[-1]
    return np.diff(at)
