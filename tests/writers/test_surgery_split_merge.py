"""``split`` and ``merge`` on datasets LeRobot wrote: a merge holds every row of its sources in
order with tasks unified; split parts are disjoint, cover the source, respect ``--by task``, and
merged back give every source row; a features mismatch is one clear error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.writers.merge import merge
from episodekit.writers.split import assign, parse_fractions, split

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]
CONTENT = ("frame_index", "timestamp", "action", "observation.state")


def rows(root: Path) -> pa.Table:
    ds = open_dataset(str(root))
    t = pa.concat_tables(pq.read_table(ds.join(f)) for f in ds.data_files)
    strings = dict(zip(ds.tasks["task_index"].to_pylist(), ds.task_strings()))
    return t.append_column("task", pa.array([strings[i] for i in t["task_index"].to_pylist()]))


def row_keys(t: pa.Table) -> list[tuple]:
    """Every row as a hashable tuple of its content (renumbered columns left out)."""
    cols = [t[c].to_pylist() for c in (*CONTENT, "task")]
    return sorted(tuple(json.dumps(v) for v in r) for r in zip(*cols))


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("sm")
    for name in ("rec40", "edited35"):
        shutil.copytree(FIXTURES / name, tmp / name)
    return tmp


def test_merge_holds_every_source_row_in_order(roots):
    out = roots / "merged"
    r = merge([str(roots / "rec40"), str(roots / "edited35")], out)
    assert r.status == "written" and r.episodes == 75
    a, b, m = rows(roots / "rec40"), rows(roots / "edited35"), rows(out)
    assert m.num_rows == a.num_rows + b.num_rows
    for c in (*CONTENT, "task"):
        assert (
            m[c]
            .combine_chunks()
            .equals(pa.concat_arrays([a[c].combine_chunks(), b[c].combine_chunks()]))
        ), c
    ds = open_dataset(str(out))
    assert sorted(ds.task_strings()) == sorted(
        set(open_dataset(str(roots / "rec40")).task_strings())
    )
    np.testing.assert_array_equal(ds.column("episode_index"), np.arange(75))
    v = subprocess.run([*CLI, "validate", str(out), "--json"], capture_output=True, text=True)
    assert v.returncode == 0 and json.loads(v.stdout)["counts"]["error"] == 0


def test_split_then_merge_gives_back_every_row(roots):
    src = roots / "rec40"
    r = split(str(src), roots / "split", parse_fractions("train=0.75,val=0.25"), seed=7)
    parts = {k: open_dataset(str(roots / "split" / k)) for k in ("train", "val")}
    assert parts["train"].num_episodes == 30 and parts["val"].num_episodes == 10
    assert r.splits["val"].status == "written"
    merged = roots / "split_merged"
    merge([str(roots / "split" / "train"), str(roots / "split" / "val")], merged)
    assert row_keys(rows(merged)) == row_keys(rows(src))
    again = split(str(src), roots / "split", parse_fractions("train=0.75,val=0.25"), seed=7)
    assert {p.status for p in again.splits.values()} == {"unchanged"}


def test_assign_by_episode_and_by_task():
    ds = open_dataset(str(FIXTURES / "rec40"))
    fr = parse_fractions("a=0.5,b=0.3,c=0.2")
    parts = assign(ds, fr, seed=1)
    assert [len(p) for p in parts.values()] == [20, 12, 8]
    allp = np.concatenate(list(parts.values()))
    assert sorted(allp.tolist()) == list(range(40))
    assert assign(ds, fr, seed=1)["b"].tolist() == parts["b"].tolist()  # seeded
    assert assign(ds, fr, seed=2)["b"].tolist() != parts["b"].tolist()
    by_task = assign(ds, parse_fractions("train=0.8,val=0.2"), seed=1, by="task")
    task = ds.column("task_index")
    seen = [set(task[p].tolist()) for p in by_task.values()]
    assert not seen[0] & seen[1] and sum(len(p) for p in by_task.values()) == 40


@pytest.mark.parametrize(
    "text, message",
    [("train=0.9", "at least two"), ("train=0.9,val=0.2", "sum to 1.1"),
     ("train=0.9,val", "not NAME=FRACTION"), ("a/b=0.5,c=0.5", "not NAME=FRACTION"),
     ("a=0.5,a=0.5", "given twice"), ("a=1,b=0", "not NAME=FRACTION")],
)  # fmt: skip
def test_parse_fractions_refuses(text, message):
    with pytest.raises(ValueError, match=message):
        parse_fractions(text)


def test_a_split_without_episodes_is_refused(tmp_path):
    ds = open_dataset(str(FIXTURES / "rec40"))
    with pytest.raises(ValueError, match="gets no episodes"):
        assign(ds, parse_fractions("a=0.99,b=0.01"), seed=0)


def test_merge_refuses_different_features(roots, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(roots / "rec40", other)
    info = json.loads((other / "meta/info.json").read_text())
    info["features"]["action"]["shape"] = [7]
    (other / "meta/info.json").write_text(json.dumps(info))
    r = subprocess.run(
        [*CLI, "merge", str(roots / "rec40"), str(other), "--out", str(tmp_path / "m")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "feature 'action' has shape [7] instead of [14]" in r.stderr
    assert not (tmp_path / "m").exists()
