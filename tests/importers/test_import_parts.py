"""The import's sketch sidecar written from its spilled parts: a row group a part, the parts'
values in order, whatever the batches a part is read back in (the write streams each part in
small batches to keep memory flat in the number of parts)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.metadata.stats.episode_sketch import (
    POINTS,
    SKETCHES_FILE,
    SKETCHES_KEY,
    EpisodeSketches,
)
from episodekit.writers import import_parts
from episodekit.writers.import_parts import EpisodeParts

INFO = {"features": {"a": {"dtype": "float32"}, "b": {"dtype": "float64"}}}
FEATS = {"a": 2, "b": 1}


def write_parts(parts: EpisodeParts, sizes: list[int]) -> list[pa.Table]:
    """Sketch parts as :meth:`EpisodeParts.flush` writes them (episodes of varied lengths)."""
    rng = np.random.default_rng(0)
    tables, first = [], 0
    for i, m in enumerate(sizes):
        length = rng.integers(1, 2 * POINTS, m)
        k = int(np.minimum(length, POINTS).sum())
        pts = {n: rng.normal(size=(d, k)) for n, d in FEATS.items()}
        sk = EpisodeSketches(np.arange(first, first + m), length, pts, POINTS)
        table = sk.table(parts.dtypes)
        pq.write_table(table, parts.dir / f"sketch-{i:06d}.parquet", compression="zstd")
        tables.append(table)
        first += m
    parts.parts = len(sizes)
    return tables


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_sidecar_is_the_parts_a_row_group_each(tmp_path: Path, monkeypatch, batch: int) -> None:
    monkeypatch.setattr(import_parts, "SKETCH_BATCH", batch)
    parts = EpisodeParts(tmp_path, INFO, FEATS)
    tables = write_parts(parts, [7, 5, 1, 9])
    parts.write_sketches(tmp_path, {"stats": "quantiles"})
    f = pq.ParquetFile(tmp_path / SKETCHES_FILE)
    assert [f.metadata.row_group(i).num_rows for i in range(4)] == [7, 5, 1, 9]
    assert f.metadata.num_row_groups == 4
    record = json.loads(f.schema_arrow.metadata[SKETCHES_KEY])
    assert record["features"] == FEATS and record["stats"] == "quantiles"
    got = f.read()
    want = pa.concat_tables(tables)
    assert got.column_names == want.column_names
    for name in want.column_names:
        assert got[name].to_pylist() == want[name].to_pylist(), name
    assert got.schema.field("points/a/0").type == pa.list_(pa.float32())
