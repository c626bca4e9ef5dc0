"""The episode sink's data files (writers.sink_data.DataFiles): files by LeRobot's roll-over rule
on the sizes given, row groups by the policy (``target`` bytes, one per ``episode``, one per
``file``, ``planned``: the caller's file numbers and group sizes, rows streamed in batches), the
same bytes as a whole file written at once, checksums read back (``read_back``: the sink's and the
dataset writer's one read-back); a file at the caller's own path, an episode a row group (repair's
rewrite)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.band import MARKER_KEY
from episodekit.core.layout.files import roll_over
from episodekit.core.parquet_write import (
    Encoding,
    RowGroupPlanError,
    RowGroupWriter,
    VerificationError,
    write_table,
)
from episodekit.writers.sink_data import (
    EDITOR,
    LEROBOT_ENCODING,
    RECORDER,
    DataFiles,
    DataPolicy,
    read_back,
)

LENGTHS = [7, 3, 12, 5, 9, 4]


def _episodes() -> list[pa.Table]:
    rng = np.random.default_rng(3)
    out, at = [], 0
    for e, n in enumerate(LENGTHS):
        state = rng.standard_normal((n, 4)).astype(np.float32)
        out.append(
            pa.table(
                {
                    "observation.state": pa.FixedSizeListArray.from_arrays(
                        pa.array(state.reshape(-1)), 4
                    ),
                    "episode_index": pa.array(np.full(n, e, dtype=np.int64)),
                    "index": pa.array(np.arange(at, at + n, dtype=np.int64)),
                }
            )
        )
        at += n
    return out


def _write(tmp_path, policy: DataPolicy, sizes=None, data_mb: float = 100.0) -> DataFiles:
    eps = _episodes()
    sink = DataFiles(tmp_path, eps[0].schema, chunks_size=2, data_mb=data_mb, policy=policy)
    for i, t in enumerate(eps):
        sink.add(t, None if sizes is None else sizes[i])
    sink.close()
    return sink


def _groups(path) -> list[int]:
    md = pq.ParquetFile(path).metadata
    return [md.row_group(i).num_rows for i in range(md.num_row_groups)]


def test_files_follow_the_roll_over_rule_on_the_sizes_given(tmp_path):
    sizes = [float(n) * 100_000 for n in LENGTHS]
    sink = _write(tmp_path, RECORDER, sizes, data_mb=1.0)
    want = roll_over(np.array(sizes), 1.0 * 2**20)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet"))
    assert len(files) == int(want.max()) + 1 == sink.file_no + 1
    assert files[2] == "data/chunk-001/file-000.parquet"  # chunks_size 2
    for f, path in enumerate(files):
        assert _groups(tmp_path / path) == [n for n, g in zip(LENGTHS, want) if g == f]


@pytest.mark.parametrize(
    "policy, groups",
    [(RECORDER, LENGTHS), (EDITOR, [sum(LENGTHS)]), (DataPolicy(target_mb=0.0), LENGTHS)],
    ids=["episode", "file", "target"],
)
def test_row_groups_by_policy(tmp_path, policy, groups):
    _write(tmp_path, policy)
    assert _groups(tmp_path / "data/chunk-000/file-000.parquet") == groups


def test_one_group_per_file_is_the_bytes_of_a_whole_file_written_at_once(tmp_path):
    _write(tmp_path / "sink", EDITOR)
    whole = pa.concat_tables(_episodes()).combine_chunks()
    write_table(whole, tmp_path / "whole.parquet", "snappy", row_group_rows=whole.num_rows)
    got = (tmp_path / "sink/data/chunk-000/file-000.parquet").read_bytes()
    assert got == (tmp_path / "whole.parquet").read_bytes()


def test_verify_reads_the_file_back_against_its_checksums(tmp_path):
    sink = _write(tmp_path, DataPolicy())
    rel = "data/chunk-000/file-000.parquet"
    sink.verify(rel)
    table = pq.read_table(tmp_path / rel)
    state = table.column("observation.state").combine_chunks()
    flat = state.values.to_numpy().copy()
    flat[5] += 1.0
    bad = table.set_column(
        0, "observation.state", pa.FixedSizeListArray.from_arrays(pa.array(flat), 4)
    )
    pq.write_table(bad, tmp_path / rel)
    with pytest.raises(VerificationError, match="observation.state"):
        sink.verify(rel)


def test_a_policy_is_one_of_the_four_layouts():
    with pytest.raises(ValueError, match="row_groups"):
        DataPolicy("chunk")


@pytest.mark.parametrize("policy", [RECORDER, EDITOR, DataPolicy(target_mb=0.0)])
def test_episodes_added_at_once_land_as_added_one_by_one(tmp_path, policy):
    sizes = [float(n) * 100_000 for n in LENGTHS]  # two files, a roll-over inside the call
    one = _write(tmp_path / "one", policy, sizes, data_mb=1.0)
    eps = _episodes()
    many = DataFiles(tmp_path / "many", eps[0].schema, chunks_size=2, data_mb=1.0, policy=policy)
    first = many.add_episodes(pa.concat_tables(eps[:4]).combine_chunks(), LENGTHS[:4], sizes[:4])
    rest = [many.add(t, s) for t, s in zip(eps[4:], sizes[4:])]
    many.close()
    assert [*first.tolist(), *rest] == roll_over(np.array(sizes), 2**20).tolist()
    for path in sorted((tmp_path / "one").rglob("*.parquet")):
        rel = path.relative_to(tmp_path / "one")
        assert (tmp_path / "many" / rel).read_bytes() == path.read_bytes(), rel
    assert many.file_no == one.file_no


def test_planned_row_groups_stream_batches_into_the_callers_file(tmp_path):
    whole = pa.concat_tables(_episodes()).combine_chunks()
    plan = [10, 12, 18]  # episode-aligned groups of the caller's plan
    enc = Encoding("zstd", sorted_index=True)
    policy = DataPolicy("planned", enc, marker='{"m": 1}')
    seen: list[int] = []
    sink = DataFiles(tmp_path / "sink", whole.schema, 2, policy=policy, on_group=seen.append)
    rel = sink.open_file(3, 100, plan)  # file 3: chunk 1 of 2-file chunks; index from 100
    for batch in whole.to_batches(max_chunksize=7):  # batches that straddle the groups
        sink.write(batch)
    assert sink.close() == rel == "data/chunk-001/file-001.parquet"
    assert _groups(tmp_path / "sink" / rel) == plan
    assert [t.num_rows for t in seen] == plan  # the caller's hook saw each group
    assert sink.file_rows[rel] == (100, sum(LENGTHS))
    meta = pq.ParquetFile(tmp_path / "sink" / rel).metadata.metadata
    assert meta[MARKER_KEY.encode()] == b'{"m": 1}'
    with RowGroupWriter(tmp_path / "direct.parquet", whole.schema, plan, enc, '{"m": 1}') as w:
        w.write(whole.to_batches()[0])
        w.finish()
    assert (tmp_path / "sink" / rel).read_bytes() == (tmp_path / "direct.parquet").read_bytes()
    with pytest.raises(ValueError, match="open_file"):
        sink.add(_episodes()[0])


def test_planned_rows_that_do_not_fill_the_plan_are_refused(tmp_path):
    whole = pa.concat_tables(_episodes()).combine_chunks()
    sink = DataFiles(tmp_path, whole.schema, policy=DataPolicy("planned", verify=False))
    sink.open_file(0, 0, [10, 100])
    sink.write(whole.to_batches()[0])
    with pytest.raises(RowGroupPlanError):
        sink.close()
    sink.abort()


def test_episode_row_groups_into_the_callers_own_file(tmp_path):
    """Repair's rewrite: a file opened at the caller's path, each write one episode's row
    group in LeRobot's encoding (the bytes RowGroupWriter wrote directly), ``index`` the rows'
    own (a dropped episode leaves a gap) and checked by the digests on the read-back."""
    eps = [t for e, t in enumerate(_episodes()) if e != 2]  # episode 2 dropped: a gap
    policy = replace(RECORDER, verify=True)
    sink = DataFiles(tmp_path / "sink", eps[0].schema, policy=policy)
    own = "data/chunk-003/file-007.parquet"
    assert sink.open_file(7, None, rel=own) == own
    for i, t in enumerate(eps):
        sink.write(t if i % 2 else t.to_batches()[0])  # a table or a batch: one group each
    assert sink.close() == own
    kept = [n for e, n in enumerate(LENGTHS) if e != 2]
    assert _groups(tmp_path / "sink" / own) == kept
    assert sink.file_rows[own] == (None, sum(kept))
    with RowGroupWriter(tmp_path / "direct.parquet", eps[0].schema, encoding=LEROBOT_ENCODING) as w:
        for t in eps:
            w.write_group(t)
        w.finish()
    assert (tmp_path / "sink" / own).read_bytes() == (tmp_path / "direct.parquet").read_bytes()
    sink.verify(own)
    table = pq.read_table(tmp_path / "sink" / own)
    index = table["index"].to_numpy().copy()
    index[-1] += 1
    pq.write_table(table.set_column(2, "index", pa.array(index)), tmp_path / "sink" / own)
    with pytest.raises(VerificationError, match="index"):
        sink.verify(own)


def test_open_file_takes_group_sizes_for_planned_row_groups_only(tmp_path):
    schema = _episodes()[0].schema
    with pytest.raises(ValueError, match="group_rows"):
        DataFiles(tmp_path, schema, policy=RECORDER).open_file(0, 0, [10])
    with pytest.raises(ValueError, match="group_rows"):
        DataFiles(tmp_path, schema, policy=DataPolicy("planned")).open_file(0, 0)
    with pytest.raises(ValueError, match="open_file"):
        DataFiles(tmp_path, schema, policy=EDITOR).open_file(0, 0)


def test_read_back_checks_groups_schema_metadata_and_the_callers_rows(tmp_path):
    """The dataset writer's checks through the same read-back: the planned row groups, the
    schema with its metadata, a check of each batch (its first row's place), the digests of
    some columns only."""
    sink = _write(tmp_path, DataPolicy(target_mb=0.0))
    rel = "data/chunk-000/file-000.parquet"
    folder, schema, rows = tmp_path, sink.schema, sum(LENGTHS)
    want = sink.checksums[rel].digests()
    read_back(folder, rel, schema, want, rows, 0, group_rows=LENGTHS)
    with pytest.raises(VerificationError, match="row groups"):
        read_back(folder, rel, schema, want, rows, 0, group_rows=[sum(LENGTHS)])
    other = schema.with_metadata({"x": "1"})
    read_back(folder, rel, other, want, rows, 0)  # metadata not checked unless asked
    with pytest.raises(VerificationError, match="schema"):
        read_back(folder, rel, other, want, rows, 0, check_metadata=True)
    with pytest.raises(VerificationError, match="rows"):
        read_back(folder, rel, schema, want, rows + 1, 0)
    with pytest.raises(VerificationError, match="index is not 5"):
        read_back(folder, rel, schema, want, rows, 5)
    seen: list[tuple[int, int]] = []
    some = {c: want[c] for c in ("observation.state",)}  # only the columns the digests name
    read_back(folder, rel, schema, some, rows, each=lambda b, at: seen.append((at, b.num_rows)))
    assert seen[0][0] == 0 and sum(n for _, n in seen) == rows
    assert [a for a, _ in seen] == np.cumsum([0] + [n for _, n in seen])[:-1].tolist()
    with pytest.raises(VerificationError, match=r"columns \['episode_index'\]"):
        read_back(folder, rel, schema, {**want, "episode_index": "0" * 40}, rows)
