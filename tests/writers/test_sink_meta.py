"""The episode sink's metadata side (writers.sink_meta): episodes rows routed to the files their
place columns name, row groups of at most the policy's rows, the same bytes as a file written
at once; info.json refused before it is touched; stats.json's quantiles by the policy; and no
dataset writer writing a metadata file around it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.layout.files import chunk_file, roll_over
from episodekit.metadata.stats import QUANTILE_KEYS
from episodekit.metadata.stats.keys import QUANTILES
from episodekit.writers import sink_meta
from episodekit.writers.sink_meta import PLACE, EpisodesFiles, MetaPolicy

REPO = Path(__file__).resolve().parents[2]


def _rows(chunk: list[int], file: list[int], start: int = 0) -> pa.Table:
    n = len(chunk)
    return pa.table(
        {
            "episode_index": pa.array(np.arange(start, start + n, dtype=np.int64)),
            "tasks": pa.array([[f"t{i % 3}"] for i in range(n)], pa.list_(pa.string())),
            PLACE[0]: pa.array(chunk, pa.int64()),
            PLACE[1]: pa.array(file, pa.int64()),
        }
    )


def _groups(path: Path) -> list[int]:
    md = pq.ParquetFile(path).metadata
    return [md.row_group(i).num_rows for i in range(md.num_row_groups)]


def test_policy_refuses_unknown_values():
    with pytest.raises(ValueError, match="stats must be one of"):
        MetaPolicy("mean")
    with pytest.raises(ValueError, match="group_rows"):
        MetaPolicy("exact", 0)


def test_places_follow_lerobots_roll_over():
    chunk, file = sink_meta.places(5, 40.0, 100.0, chunks_size=2)
    # two rows of 40 bytes a file (a third would pass 100): files 0, 0, 1, 1, 2; 2 a chunk
    assert chunk.tolist() == [0, 0, 0, 0, 1] and file.tolist() == [0, 0, 1, 1, 0]
    chunk, file = sink_meta.places(5, 40.0, 100.0, chunks_size=1)
    assert chunk.tolist() == [0, 0, 1, 1, 2] and file.tolist() == [0, 0, 0, 0, 0]
    want = chunk_file(roll_over(np.full(7, 33.0), 64.0), 3)
    got = sink_meta.places(7, 33, 64, 3)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_rows_go_to_their_files_in_groups_of_at_most_the_policys_rows(tmp_path):
    policy = MetaPolicy("exact", group_rows=3)
    with EpisodesFiles(tmp_path, policy) as files:
        files.write(_rows([0, 0, 0, 0, 0], [0, 0, 0, 0, 1]))  # 4 rows to file 0, 1 to file 1
        files.write(_rows([0, 0, 1], [1, 1, 0], start=5))
    assert files.files == [
        "meta/episodes/chunk-000/file-000.parquet",
        "meta/episodes/chunk-000/file-001.parquet",
        "meta/episodes/chunk-001/file-000.parquet",
    ]
    f0, f1, c1 = (tmp_path / rel for rel in files.files)
    assert _groups(f0) == [3, 1]  # one write's 4 rows: groups of at most 3
    assert _groups(f1) == [1, 2]  # a group per write
    assert _groups(c1) == [1]
    assert pq.read_table(f0)["episode_index"].to_pylist() == [0, 1, 2, 3]
    assert pq.read_table(f1)["episode_index"].to_pylist() == [4, 5, 6]
    assert pq.read_table(c1)["episode_index"].to_pylist() == [7]


def test_rows_of_a_file_need_not_be_contiguous(tmp_path):
    with EpisodesFiles(tmp_path, sink_meta.REPAIR) as files:
        files.write(_rows([0, 0, 0, 0], [0, 1, 0, 1]))
    got = [pq.read_table(tmp_path / rel)["episode_index"].to_pylist() for rel in files.files]
    assert got == [[0, 2], [1, 3]]


def test_a_whole_table_is_the_bytes_of_the_file_written_at_once(tmp_path):
    """The surgery and sample writers' files: as ``pq.write_table`` of each file's rows."""
    table = _rows([0] * 6 + [1] * 4, [0] * 6 + [0] * 4)
    rels = sink_meta.write_episodes(tmp_path / "a", table, sink_meta.SURGERY)
    for rel, part in zip(rels, (table.slice(0, 6), table.slice(6, 4))):
        pq.write_table(part, tmp_path / "b.parquet", compression="snappy")
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_tasks_table_or_strings(tmp_path):
    sink_meta.write_tasks(tmp_path, ["pick", "place"], index_name="task")
    t = pq.read_table(tmp_path / "meta/tasks.parquet")
    assert t["task_index"].to_pylist() == [0, 1] and t["task"].to_pylist() == ["pick", "place"]
    kept = t.filter(pa.array([True, False]))
    sink_meta.write_tasks(tmp_path / "k", kept)
    assert pq.read_table(tmp_path / "k/meta/tasks.parquet").equals(kept)


def test_info_with_a_number_that_is_not_finite_writes_nothing(tmp_path):
    with pytest.raises(ValueError):
        sink_meta.write_info(tmp_path, {"fps": float("inf")})
    assert not (tmp_path / "meta/info.json").exists()
    sink_meta.write_info(tmp_path, {"fps": 30, "features": {}})
    assert (tmp_path / "meta/info.json").read_text() == json.dumps(
        {"fps": 30, "features": {}}, indent=4
    )


def test_stats_policy_decides_the_quantiles(tmp_path):
    from episodekit.sample import write_sample

    root = write_sample(tmp_path / "s", episodes=6, seed=2, videos=0, images=False)
    stats = json.loads((root / "meta/stats.json").read_text())
    lerobot = stats["observation.state"]["q50"]
    sink_meta.finish_stats(root, json.loads(json.dumps(stats)), sink_meta.SAMPLE)
    assert json.loads((root / "meta/stats.json").read_text()) == stats  # as given

    rels = sorted(p.relative_to(root).as_posix() for p in root.glob("data/*/*.parquet"))
    dims = len(lerobot)
    sink_meta.finish_stats(root, stats, sink_meta.IMPORT, rels, {"observation.state": dims})
    got = json.loads((root / "meta/stats.json").read_text())["observation.state"]
    col = pa.concat_tables([pq.read_table(root / r, columns=["observation.state"]) for r in rels])
    values = col["observation.state"].combine_chunks().flatten().to_numpy().reshape(-1, dims)
    for key, q in zip(QUANTILE_KEYS, QUANTILES):
        np.testing.assert_array_equal(got[key], np.quantile(values.astype(np.float64), q, axis=0))
    assert got["q50"] != lerobot  # a mean of the episodes' medians is not the median


# the metadata files and the calls that write them: only writers/sink_meta.py makes them
WRITES = re.compile(
    r"plain_writer\(|meta/episodes/chunk-\{|_dest\(staging, (?:TASKS|INFO|STATS)\)"
    r'|(?:write_table|atomic_write_text)\([^\n]*(?:"meta/|\bINFO|\bSTATS|\bTASKS)'
)
WRITERS = ["writers/writer.py", "writers/sink.py", "writers/import_parts.py", "sample/writer.py",
           "writers/repair_build.py", "writers/repair_episodes.py", "writers/meta.py",
           "writers/stats_quantiles.py"]  # fmt: skip


@pytest.mark.parametrize("rel", WRITERS)
def test_no_writer_writes_its_metadata_around_the_sink(rel):
    text = (REPO / rel).read_text()
    found = [m.group(0) for m in WRITES.finditer(text)]
    assert not found, f"{rel} writes metadata itself: {found}"
