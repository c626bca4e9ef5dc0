"""``repair_kept.Kept``: what is appended is what is read back, an episode at a time or a
column at a time, whether its index/length/first_index are its run's (held once, in the data
file) or not (held apart), and numbers past int32."""

from __future__ import annotations

import numpy as np

from episodekit.writers.repair_inspect import DataFile
from episodekit.writers.repair_kept import INTS, Episode, Kept, column


def _file(rel: str, episodes: list[int], first: int) -> DataFile:
    df = DataFile(rel, 0, 0, 1, True)
    df.episode = np.array(episodes, np.int64)
    df.rows = np.array([10 + e for e in episodes], np.int64)
    df.first_index = first + np.cumsum(np.r_[0, df.rows[:-1]])
    return df


def test_kept_reads_back_what_was_appended():
    a, b = _file("a", [0, 1, 2], 0), _file("b", [3, 4], 1 << 40)
    kept = Kept([a, b], ["cam"], capacity=1)
    eps = [
        Episode(0, 10, 0, a, 0, 0, 0, ["t"], {"cam": (0, 0, 0.0, 1.0)}),
        Episode(2, 12, 23, a, 2, None, None, ["t", "u"], {"cam": (0, 0, 1.0, 2.0)}, "new"),
        Episode(3, 13, 1 << 40, b, 0, 1 << 33, 1 << 33, [], {}),  # past int32, no camera
        Episode(9, 5, 7, b, 1, None, 4, ["t"], {"cam": (0, 1, 0.0, 0.5)}, "x"),  # not its run's
        Episode(4, 14, (1 << 40) + 13, b, 7, 5, 5, ["t"], {"cam": (0, 1, 0.5, 1.0)}),  # no run 7
    ]
    for e in eps:
        kept.append(e)
    assert list(kept) == eps and kept[-2] == eps[-2] and kept[1:3] == eps[1:3]
    for name in INTS:
        want = [-1 if getattr(e, name) is None else getattr(e, name) for e in eps]
        assert column(kept, name).tolist() == want
        assert column(kept, name).dtype == np.int64
    assert kept.files().tolist() == [0, 0, 1, 1, 1]
