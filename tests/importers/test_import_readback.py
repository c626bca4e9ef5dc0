"""The import's read-back of each full data file (a checkpoint, with the cameras alive) goes
through small column buffers (``writers.sink_data.VERIFY_BUFFER``, not the default 32 MiB shared
between the columns): part of what kept the import's peak memory growing with the episodes
(docs/import.md, Memory). The output is the same whatever the buffers."""

from __future__ import annotations

from pathlib import Path

import pytest

from episodekit.core import parquet_read
from episodekit.writers import sink_data as sink_mod
from episodekit.writers.import_run import ImportOptions, run_import
from tests.importers.test_import_resume import write_source


def test_the_checkpoint_read_back_uses_small_buffers(tmp_path: Path, monkeypatch) -> None:
    src = write_source(tmp_path / "src", episodes=24, steps=20)
    calls: list[dict] = []

    def recording(path, *args, **kwargs):
        calls.append(dict(kwargs))
        return parquet_read.open_data_file(path, *args, **kwargs)

    monkeypatch.setattr(sink_mod, "open_data_file", recording)
    res = run_import(str(src), tmp_path / "out", ImportOptions(fps=50, data_mb=0.05))
    assert res.data_files >= 2  # a checkpoint or more, then the final verification
    assert len(calls) >= 2 * res.data_files - 1  # each file at its checkpoint, all at the end
    assert all(c.get("buffer") == sink_mod.VERIFY_BUFFER for c in calls), calls


@pytest.mark.parametrize("buffer", [None, 64 * 1024])
def test_open_data_file_buffer(tmp_path: Path, buffer: int | None) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "f.parquet"
    table = pa.table({"a": np.arange(50_000), "b": np.arange(50_000) * 0.5})
    pq.write_table(table, path, row_group_size=20_000)
    with parquet_read.open_data_file(str(path), stream=True, buffer=buffer) as df:
        got = pa.Table.from_batches(list(df.batches(7_000)))
    assert got.equals(table)
