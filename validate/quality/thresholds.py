"""The ``quality.*`` checks' names and documented thresholds (:data:`DEFAULTS`), and
:func:`load_thresholds` (a JSON/TOML file and overrides)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from episodekit.validate import drift
from episodekit.validate.checks import ids

MAX_PER_CHECK = 50  # findings of one check beyond this are summarized in one line
SAMPLE_ROWS = 200_000  # rows of the strided sample the dataset-level robust scales come from
SIGNAL_POINTS = 48  # points of the offending signal attached to a finding (sparkline / plot)
FEATURE_PREFIXES = ("action", "observation.state")

# Every threshold, with what it means. Units in the name; "share" is a fraction in [0, 1].
DEFAULTS: dict[str, float] = {
    # quality.frozen: one identical vector over >= this share of an episode ...
    "frozen_share": 0.5,
    # ... and at least this many frames (short episodes can be legitimately still).
    "frozen_min_frames": 10,
    # quality.frozen_run: an identical vector held mid-episode (not touching its first or last
    # frame, where a robot at rest is normal) for >= this many seconds.
    "frozen_run_seconds": 3.0,
    # quality.jump: a step |x[t+1] - x[t]| above this many robust step deviations of the
    # dimension (1.4826 x median |nonzero step| over the dataset, i.e. MAD) ...
    "jump_sigmas": 20.0,
    # ... and above this share of the dimension's robust range (q99 - q1 over the dataset),
    # so heavy-tailed but real motions (a fast gripper) do not fire.
    "jump_range_share": 0.3,
    # quality.out_of_range: a value beyond [q1 - k s, q99 + k s] of the dataset, where
    # s = (q99 - q1) / 4.653 is the robust standard deviation (dimensions with q1 == q99 are
    # not judged).
    "range_sigmas": 5.0,
    # quality.clipping: frames sitting exactly at the episode's min (or max) of a dimension,
    # outside the constant runs at its start and end, >= this share of the episode ...
    "clip_share": 0.1,
    # ... and at least this many frames.
    "clip_min_frames": 5,
    # quality.action_range: an action beyond the state's dataset [min, max] of the same joint by
    # more than this share of the state's range.
    "action_state_margin": 0.5,
    # quality.dropped_frames: a timestamp step > this / fps.
    "drop_factor": 1.5,
    # quality.frame_interval: |mean timestamp step x fps - 1| above this (episodes without drops).
    "interval_tolerance": 0.05,
    # quality.short_episode: fewer frames than this (0 = off; --min-length).
    "min_length": 0,
    # quality.length_outlier: |log(length) - task median| above this many robust deviations
    # (1.4826 x MAD of log lengths, at least length_log_floor) ...
    "length_sigmas": 5.0,
    "length_log_floor": 0.25,
    # ... in tasks with at least this many episodes.
    "length_min_episodes": 10,
    # quality.duplicate: another episode of the same length within this share of each
    # dimension's robust range at every frame (0 = identical).
    "duplicate_tolerance": 1e-3,
    # quality.task_rare: a task with fewer episodes than this while the median task has at
    # least task_rare_factor times as many.
    "min_task_episodes": 2,
    "task_rare_factor": 10,
    # quality.shift: first vs last quarter of the episodes (by episode_index), episodes as
    # samples, medians and MADs: the median episode mean moves with z > shift_sigmas and by
    # > shift_effect standard deviations, or the median within-episode standard deviation
    # changes by > shift_std_ratio with z > shift_sigmas (on log std); >= shift_min_episodes.
    "shift_sigmas": 6.0,
    "shift_effect": 0.5,
    "shift_std_ratio": 2.0,
    "shift_min_episodes": 40,
    **drift.DEFAULTS,  # quality.drift (validate/drift.py)
}

# The quality.* checks (described in episodekit.validate.checks, with the thresholds above).
CHECKS: tuple[str, ...] = ids("quality")

PLACEHOLDER_TASKS = {
    "",
    "task",
    "tasks",
    "default",
    "default task",
    "none",
    "null",
    "nan",
    "n/a",
    "na",
    "todo",
    "tbd",
    "placeholder",
    "test",
    "example",
    "unknown",
    "dummy",
    "xxx",
    "...",
    "-",
}
PLACEHOLDER_PATTERN = re.compile(r"^(task|episode|demo)[ _-]?\d+$|^<.*>$|^\{.*\}$")

# A normal distribution's standard deviation over its median absolute deviation (MAD): the
# robust scales below are MAD_TO_SIGMA x MAD.
MAD_TO_SIGMA = 1.4826


class ThresholdsError(ValueError):
    """A thresholds file is unreadable or names an unknown threshold."""


def load_thresholds(path: str | Path | None = None, **overrides: Any) -> dict[str, float]:
    """:data:`DEFAULTS` updated from a JSON or TOML file (``.toml`` by suffix; a top-level
    ``[quality]`` table is accepted too) and from ``overrides`` (None values are ignored)."""
    out = dict(DEFAULTS)
    given: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text()
            if p.suffix.lower() == ".toml":
                from episodekit.core import toml

                given = toml.loads(text)
            else:
                given = json.loads(text)
        except (OSError, ValueError) as exc:
            raise ThresholdsError(f"cannot read thresholds file {p}: {exc}") from exc
        if isinstance(given, dict) and isinstance(given.get("quality"), dict):
            given = given["quality"]
        if not isinstance(given, dict):
            raise ThresholdsError(f"thresholds file {p} must hold an object of name: number")
    given = {**given, **{k: v for k, v in overrides.items() if v is not None}}
    for k, v in given.items():
        if k not in DEFAULTS:
            raise ThresholdsError(
                f"unknown quality threshold {k!r}; known: {', '.join(sorted(DEFAULTS))}"
            )
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ThresholdsError(f"quality threshold {k!r} must be a number >= 0, got {v!r}")
        out[k] = float(v)
    return out
