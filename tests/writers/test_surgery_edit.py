"""The surgery writer through ``edit`` on datasets LeRobot wrote (rec40, edited35): the dropped
episodes are gone, every kept row equals its source row, the loader's samples equal the
source's, metadata and stats are carried over or recomputed, reruns are no-ops, and a write
killed half-way leaves nothing behind that the next run trips on."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.band import file_needs_rewrite
from episodekit.core.dataset import open_dataset
from episodekit.core.footer import file_layout
from episodekit.metadata import lerobot_stats
from episodekit.writers.edit import EditSpec, edit
from episodekit.writers.select import choose, parse_episode_list
from episodekit.writers.sources import source_episodes
from episodekit.writers.writer import write_dataset

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
DROP = (3, 12)
RENUMBERED = ("index", "episode_index", "task_index")


def rows(root: Path) -> pa.Table:
    ds = open_dataset(str(root))
    return pa.concat_tables(pq.read_table(ds.join(f)) for f in ds.data_files)


@pytest.fixture(scope="module", params=["rec40", "edited35"])
def edited(request, tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp(request.param)
    src = tmp / request.param
    shutil.copytree(FIXTURES / request.param, src)
    result = edit(str(src), tmp / "out", EditSpec(drop_episodes=DROP))
    assert result.write.status == "written" and sorted(result.dropped) == list(DROP)
    return src, tmp / "out"


def test_dropped_episodes_are_gone_and_kept_rows_equal_the_source(edited):
    src, out = edited
    a, b = rows(src), rows(out)
    keep = ~np.isin(a["episode_index"].to_numpy(), DROP)
    a = a.filter(pa.array(keep))
    assert b.num_rows == a.num_rows
    for name in a.column_names:
        if name not in RENUMBERED:
            assert b[name].equals(a[name]), name
    # renumbered: index 0..N-1, episodes 0..E-1 in source order, tasks by string
    np.testing.assert_array_equal(b["index"].to_numpy(), np.arange(b.num_rows))
    old_eps = np.unique(a["episode_index"].to_numpy())
    new_of_old = {int(e): i for i, e in enumerate(old_eps)}
    np.testing.assert_array_equal(
        b["episode_index"].to_numpy(), [new_of_old[e] for e in a["episode_index"].to_numpy()]
    )
    src_tasks, out_tasks = open_dataset(str(src)).tasks, open_dataset(str(out)).tasks
    s = dict(zip(src_tasks["task_index"].to_pylist(), src_tasks["task"].to_pylist()))
    o = dict(zip(out_tasks["task_index"].to_pylist(), out_tasks["task"].to_pylist()))
    assert [o[t] for t in b["task_index"].to_pylist()] == [
        s[t] for t in a["task_index"].to_pylist()
    ]


def test_metadata_and_layout(edited):
    src, out = edited
    ds_src, ds = open_dataset(str(src)), open_dataset(str(out))
    assert ds.num_episodes == ds_src.num_episodes - len(DROP)
    assert ds.info["total_frames"] == ds.num_frames and ds.info["splits"] == {
        "train": f"0:{ds.num_episodes}"
    }
    kept = [e for e in ds_src.column("episode_index").tolist() if e not in DROP]
    np.testing.assert_array_equal(ds.column("length"), ds_src.column("length")[kept])
    assert ds.episodes["tasks"].to_pylist() == [ds_src.episodes["tasks"][e].as_py() for e in kept]
    for rel in ds.data_files:  # prep's layout: prepare skips these files
        assert file_needs_rewrite(file_layout(str(out / rel)), 32 << 20) is None
    # every column LeRobot writes, in the episodes table
    src_cols = set(pq.read_schema(next((src / "meta/episodes").rglob("*.parquet"))).names)
    out_cols = set(pq.read_schema(next((out / "meta/episodes").rglob("*.parquet"))).names)
    assert src_cols == out_cols


def test_stats_reused_for_kept_episodes_and_aggregated(edited):
    src, out = edited
    se = pq.read_table(next((src / "meta/episodes").rglob("*.parquet")))
    oe = pq.read_table(next((out / "meta/episodes").rglob("*.parquet")))
    kept = [e for e in range(se.num_rows) if e not in DROP]
    for col in ("stats/action/mean", "stats/observation.state/q99", "stats/frame_index/max"):
        assert oe[col].to_pylist() == se[col].take(pa.array(kept)).to_pylist()
    # renumbered columns: recomputed from the new values
    assert [x[0] for x in oe["stats/index/min"].to_pylist()] == oe["dataset_from_index"].to_pylist()
    assert [x[0] for x in oe["stats/episode_index/max"].to_pylist()] == list(range(oe.num_rows))
    stats = json.loads((out / "meta/stats.json").read_text())
    per = [
        {k: np.asarray(oe[f"stats/action/{k}"][e].as_py()) for k in ("min", "max", "mean", "std",
         "count", "q01", "q10", "q50", "q90", "q99")}
        for e in range(oe.num_rows)
    ]  # fmt: skip
    agg = lerobot_stats.aggregate(per)
    np.testing.assert_allclose(stats["action"]["mean"], agg["mean"])
    assert stats["action"]["count"] == [int(oe["length"].to_numpy().sum())]


def test_loader_samples_equal_the_source(edited):
    from episodekit.loaders import FrameDataset

    src, out = edited
    delta = {"action": [i / 30 for i in range(10)], "observation.state": [-2 / 30, -1 / 30, 0]}
    a = FrameDataset(str(src), delta_timestamps=delta, speed=False, store=None)
    b = FrameDataset(str(out), delta_timestamps=delta, speed=False, store=None)
    ds_src = open_dataset(str(src))
    kept = [e for e in ds_src.column("episode_index").tolist() if e not in DROP]
    src_rows = np.concatenate(
        [np.arange(f, t) for f, t in zip(ds_src.column("dataset_from_index")[kept],
                                         ds_src.column("dataset_to_index")[kept])]
    )  # fmt: skip
    rng = np.random.default_rng(0)
    for i in sorted(set(rng.integers(0, len(b), 40).tolist()) | {0, len(b) - 1}):
        sa, sb = a[int(src_rows[i])], b[i]
        for k in sa:
            if k in RENUMBERED:
                continue
            np.testing.assert_array_equal(np.asarray(sb[k]), np.asarray(sa[k]), err_msg=k)


def test_rerun_is_a_no_op_and_new_options_rewrite(edited):
    src, out = edited
    before = sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file())
    again = edit(str(src), out, EditSpec(drop_episodes=DROP))
    assert again.write.status == "unchanged"
    after = sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file())
    assert [x for x in after if x[0].name != ".episodekit.lock"] == [
        x for x in before if x[0].name != ".episodekit.lock"
    ]
    task = open_dataset(str(src)).task_strings()[0]
    r = edit(str(src), out, EditSpec(drop_episodes=DROP, rename_tasks=((task, "pick"),)))
    assert r.write.status == "written"  # other options: the output is replaced
    assert "pick" in open_dataset(str(out)).task_strings()
    assert edit(str(src), out, EditSpec(drop_episodes=DROP)).write.status == "written"


def test_remove_feature_and_rename_task(tmp_path):
    src = tmp_path / "rec40"
    shutil.copytree(FIXTURES / "rec40", src)
    old = open_dataset(str(src)).task_strings()[0]
    spec = EditSpec(remove_features=("observation.state",), rename_tasks=((old, "renamed"),))
    edit(str(src), tmp_path / "out", spec)
    ds = open_dataset(str(tmp_path / "out"))
    assert "observation.state" not in ds.features
    assert "observation.state" not in pq.read_schema(ds.data_path(0)).names
    hf = json.loads(pq.read_schema(ds.data_path(0)).metadata[b"huggingface"])
    assert "observation.state" not in hf["info"]["features"]
    assert "renamed" in ds.task_strings() and old not in ds.task_strings()
    names = pq.read_schema(next((tmp_path / "out/meta/episodes").rglob("*.parquet"))).names
    assert not any(c.startswith("stats/observation.state/") for c in names)
    assert "observation.state" not in json.loads((tmp_path / "out/meta/stats.json").read_text())


@pytest.mark.parametrize(
    "text, expect",
    [("3,7,10-12", [3, 7, 10, 11, 12]), (" 5 , 5,1", [1, 5]), ("0-0", [0])],
)
def test_parse_episode_list(text, expect):
    assert parse_episode_list(text) == expect


@pytest.mark.parametrize("text", ["3,x", "5-2", "-1", "", "1-2-3", ","])
def test_parse_episode_list_refuses(text):
    with pytest.raises(ValueError, match="--drop-episodes"):
        parse_episode_list(text)


def test_choose_refuses_unknown_episodes_and_tasks(tmp_path):
    ds = open_dataset(str(FIXTURES / "rec40"))
    with pytest.raises(ValueError, match=r"episodes \[40\] are not in"):
        choose(ds, drop=[1, 40])
    with pytest.raises(ValueError, match="no task 'nope'"):
        choose(ds, drop_tasks=["nope"])
    task = ds.task_strings()[1]
    kept, why = choose(ds, drop_tasks=[task])
    assert all(task not in ds.episodes["tasks"][e].as_py() for e in kept.tolist())
    assert set(why.values()) == {"--drop-tasks"}


def test_out_is_never_a_source_or_inside_one(tmp_path):
    ds = open_dataset(str(FIXTURES / "rec40"))
    from episodekit.core.errors import EnvironmentProblem

    with pytest.raises(EnvironmentProblem, match="it is inside the source dataset"):
        write_dataset(source_episodes(ds, [0, 1]), FIXTURES / "rec40" / "sub")
    assert not (FIXTURES / "rec40" / "sub").exists()


CHILD = r"""
import sys
from episodekit.writers.edit import EditSpec, edit
edit(sys.argv[1], sys.argv[2], EditSpec(drop_episodes=(3,)))
"""


def test_kill_9_mid_write_then_rerun_completes(tmp_path):
    src = tmp_path / "rec40"
    shutil.copytree(FIXTURES / "rec40", src)
    out = tmp_path / "out"
    env = {**os.environ, "EPISODEKIT_TEST_KILL_BEFORE_REPLACE": "stats.json"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(src), str(out)], env=env)
    assert proc.returncode == -signal.SIGKILL
    staged = list(tmp_path.glob(".out.episodekit-partial-*"))
    assert len(staged) == 1 and not (out / "meta").exists()  # nothing published
    result = edit(str(src), out, EditSpec(drop_episodes=(3,)))
    assert result.write.status == "written"
    assert not list(tmp_path.glob(".out.episodekit-partial-*")) and not list(
        tmp_path.glob(".out.episodekit-old-*")
    )
    assert open_dataset(str(out)).num_episodes == 39


@pytest.mark.parametrize("n", [1, 2, 7, 300, 5000, 12001])
def test_closed_form_stats_match_lerobots_within_one_bin(n):
    from episodekit.writers.meta import _closed_form_stats

    for kind, start in (("range", 123_456), ("constant", 17)):
        got = _closed_form_stats(kind, np.array([start]), np.array([n]))
        values = np.arange(start, start + n) if kind == "range" else np.full(n, start)
        want = lerobot_stats.episode_stats(values.reshape(-1, 1))
        one_bin = (values.max() - values.min() + 2e-10) / 5000 + 1e-9
        for k in ("min", "max", "mean", "std"):
            np.testing.assert_allclose(got[k][0], want[k], rtol=1e-9, atol=1e-6, err_msg=k)
        for k in lerobot_stats.LEROBOT_QUANTILE_KEYS:
            assert abs(got[k][0, 0] - want[k][0]) <= one_bin, (kind, n, k)


def test_task_values_keep_each_episodes_tasks():
    from episodekit.writers.data import TaskValues

    tv = TaskValues()
    tv.add(np.array([0, 0, 1, 1, 1]), np.array([4, 4, 2, 3, 2]))
    tv.add(np.array([1, 2, 2]), np.array([2, 5, 5]))
    assert tv.constant(0) == 4 and tv.constant(2) == 5 and np.isnan(tv.constant(1))
    assert tv.values(1).tolist() == [2, 3, 2, 2]
    assert tv.values(0).tolist() == [4, 4]


def test_a_corrupted_write_is_caught_and_nothing_is_published(tmp_path, monkeypatch):
    """A pipeline bug that changes one value between reading and writing: the checksums of the
    read-back output differ from the source's, the command fails (exit 1) and --out is absent."""
    from episodekit.core.errors import DatasetError
    from episodekit.core.parquet_write import RowGroupWriter

    real = RowGroupWriter._put

    def corrupt(writer, table):  # after the group's checksum, before its bytes
        if "timestamp" not in table.column_names:  # not a data file (the sketch sidecar)
            return real(writer, table)
        ts = table.column("timestamp").to_numpy().copy()
        ts[0] += 1.0
        i = table.schema.get_field_index("timestamp")
        table = table.set_column(i, "timestamp", pa.array(ts, table.schema.field(i).type))
        real(writer, table)

    monkeypatch.setattr(RowGroupWriter, "_put", corrupt)
    src = tmp_path / "rec40"
    shutil.copytree(FIXTURES / "rec40", src)
    with pytest.raises(DatasetError, match=r"failed verification.*columns \['timestamp'\]"):
        edit(str(src), tmp_path / "out", EditSpec(drop_episodes=(1,)))
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.episodekit-partial-*"))
