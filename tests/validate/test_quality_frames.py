"""The frames a frame-level quality finding names (``details.frames``), and how
``edit --drop-flagged`` reads them from a report: per finding, and from the ``... and N more``
summary finding; a finding without frames (another check, an older report) flags its episode."""

from __future__ import annotations

import numpy as np

from episodekit.validate.flagged import episodes_of_findings, frames_of_findings
from episodekit.validate.quality.frames import (
    beyond_frames,
    frozen_frames,
    jump_frames,
    merge_frames,
)


def test_frozen_runs():
    x = np.arange(20, dtype=float).reshape(-1, 1).repeat(2, axis=1)
    x[3:6] = x[3]  # a 3-frame run in the middle
    x[12:] = x[12]  # the 8-frame tail: the longest
    assert frozen_frames(x) == [[12, 19]]
    assert frozen_frames(x, mid_only=True) == [[3, 5]]
    assert frozen_frames(np.arange(5.0).reshape(-1, 1)) == []


def test_spikes_out_and_back():
    x = np.zeros(30)
    x[10:13] = 100.0
    assert beyond_frames(x, -1, 1) == [[10, 12]]
    assert jump_frames(x, 50, 10) == [[10, 12]]  # the largest step is the way out
    assert jump_frames(x, 50, 13) == [[10, 12]]  # ... or the way back
    step = np.r_[np.zeros(10), np.full(20, 100.0)]
    assert jump_frames(step, 50, 10) == [[10, 10]]  # a level shift: the frame it lands on
    assert merge_frames([[5, 7], [1, 2], [3, 4], [10, 11]]) == [[1, 7], [10, 11]]


def test_report_frames_and_whole_episodes():
    findings = [
        {"check": "quality.frozen", "episode": 4, "details": {"frames": [[10, 30]]}},
        {"check": "quality.jump", "episode": 7, "details": {"frames": [[3, 3]]}},
        {"check": "quality.jump", "episode": 9, "details": {}},  # an older report: no frames
        {"check": "quality.duplicate", "episode": 2, "details": {}},
        {"check": "quality.frozen", "episode": None,
         "details": {"more": 2, "episodes": [11, 12], "frames": {"11": [[0, 5]]}}},
        {"check": "quality.frozen", "episode": 13, "details": {"frames": "nonsense"}},
    ]  # fmt: skip
    checks = ["quality.frozen", "quality.jump", "quality.duplicate"]
    assert frames_of_findings(findings, checks) == {
        4: ([[10, 30]], ["quality.frozen"]),
        7: ([[3, 3]], ["quality.jump"]),
        11: ([[0, 5]], ["quality.frozen"]),
    }
    whole = episodes_of_findings(findings, checks, frames=True)
    assert sorted(whole) == [2, 9, 12, 13]
    assert sorted(episodes_of_findings(findings, checks)) == [2, 4, 7, 9, 11, 12, 13]
