"""``RecoveredColumns``: a recovered row's place found when asked (no column of every row's place
held) is the one its file and row say; integer columns held past the plan are int32."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from episodekit.writers.repair_columns import RecoveredColumns


def test_place_is_each_rows_file_and_row_in_it():
    rng = np.random.default_rng(3)
    rec = RecoveredColumns()
    at = 0
    for file, tables in enumerate([3, 0, 2, 1]):
        for _ in range(tables):
            n = int(rng.integers(0, 7))
            rec.add(pa.table({"episode_index": np.arange(at, at + n, dtype=np.int64)}), file)
            at += n
    rows = rng.permutation(rec.num_rows)
    files, in_file = rec.place(rows)
    assert files.tolist() == rec.file_of[rows].tolist()
    assert in_file.tolist() == rec.row_in_file[rows].tolist()
    assert rec.files() == sorted(set(rec.file_of.tolist()))


def test_columns_kept_after_the_plan_are_int32_while_they_fit():
    rec = RecoveredColumns()
    rec.add(pa.table({"episode_index": np.arange(5, dtype=np.int64), "length": [1] * 5}), 0)
    rec.add(pa.table({"episode_index": np.array([1 << 40], np.int64), "length": [1]}), 0)
    rec.keep_only(("episode_index",))
    assert [v.dtype for _, v in rec._parts["episode_index"]] == [np.int32, np.int64]
    assert rec.episode_index().tolist() == [0, 1, 2, 3, 4, 1 << 40]
