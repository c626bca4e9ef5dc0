"""The frames a frame-level quality finding points at, so that ``edit --drop-flagged`` can drop
those frames instead of the whole episode.

A finding of :data:`FRAME_CHECKS` carries ``details.frames``: ``[first, last]`` ranges
(inclusive; frame positions in the episode, i.e. its ``frame_index``), computed on the flagged
episode's values when it is read again for its signal:

- ``quality.frozen``: the longest run of identical consecutive vectors (the run the check
  measured); ``quality.frozen_run``: the longest such run touching neither the first nor the last
  frame;
- ``quality.out_of_range``: every frame whose value of the flagged dimension lies beyond the
  check's limits (a spike: its frames, not the episode);
- ``quality.jump``: the frames between the largest step and the next step of opposite sign past
  the check's limit (a spike that comes back), else the one frame the step lands on.

Other checks (dropped frames, timing, durations, duplicates, ...) judge whole episodes, or frames
that are missing: their findings carry no frames and flag the episode.
"""

from __future__ import annotations

import numpy as np

FRAME_CHECKS = ("quality.frozen", "quality.frozen_run", "quality.jump", "quality.out_of_range")


def true_runs(mask: np.ndarray) -> list[list[int]]:
    """The runs of True in ``mask`` as ``[first, last]`` (inclusive)."""
    d = np.diff(np.r_[0, np.asarray(mask, dtype=np.int8), 0])
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1) - 1
    return [[int(a), int(b)] for a, b in zip(starts, ends)]


def frozen_frames(x: np.ndarray, mid_only: bool = False) -> list[list[int]]:
    """The longest run (>= 2 frames) of identical consecutive rows of ``x`` (frames, D); with
    ``mid_only``, the longest that touches neither the first nor the last frame."""
    x = np.asarray(x).reshape(len(x), -1)
    if len(x) < 2:
        return []
    same = np.all(x[1:] == x[:-1], axis=1)  # step t: frames t and t+1 equal
    runs = [[a, b + 1] for a, b in true_runs(same)]
    if mid_only:
        runs = [r for r in runs if r[0] > 0 and r[1] < len(x) - 1]
    if not runs:
        return []
    return [max(runs, key=lambda r: (r[1] - r[0], -r[0]))]


def beyond_frames(x: np.ndarray, lo: float, hi: float) -> list[list[int]]:
    """The frames of ``x`` (one dimension) outside ``[lo, hi]``."""
    with np.errstate(invalid="ignore"):
        return true_runs((x < lo) | (x > hi))


def jump_frames(x: np.ndarray, limit: float, at: int) -> list[list[int]]:
    """The frames a jump landing on frame ``at`` moved away (see the module docstring)."""
    if not 0 < at < len(x):
        return []
    step = np.diff(np.asarray(x, dtype=np.float64))
    sign = np.sign(step[at - 1])
    with np.errstate(invalid="ignore"):
        back = np.flatnonzero((np.abs(step) > limit) & (np.sign(step) == -sign))
    after = back[back >= at]
    if len(after):  # a spike that comes back: its frames
        return [[at, int(after[0])]]
    before = back[back < at - 1]
    if len(before):  # the largest step was the way back: the frames since the way out
        return [[int(before[-1]) + 1, at - 1]]
    return [[at, at]]


def finding_frames(
    check: str,
    values: np.ndarray,
    dimension: int | None,
    limits: tuple[float, ...] | None,
    at: int | None,
) -> list[list[int]] | None:
    """``details.frames`` of a finding of ``check`` on one episode's ``values`` (frames, D) of
    its feature; None for a check that does not point at frames."""
    if check == "quality.frozen":
        return frozen_frames(values)
    if check == "quality.frozen_run":
        return frozen_frames(values, mid_only=True)
    if dimension is None or limits is None:
        return None
    x = values[:, dimension]
    if check == "quality.out_of_range":
        return beyond_frames(x, limits[0], limits[1])
    if check == "quality.jump" and at is not None:
        return jump_frames(x, limits[0], at)
    return None


def merge_frames(ranges: list[list[int]]) -> list[list[int]]:
    """Overlapping or touching ``[first, last]`` ranges merged, sorted."""
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out
