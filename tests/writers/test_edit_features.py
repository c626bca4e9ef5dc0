"""``edit --add-feature NAME --from FILE`` and ``--rename-feature OLD=NEW`` on rec40 (LeRobot's
recorder): the new column holds the file's value of every frame, is declared (info.json, the
schema's huggingface metadata) with its stats computed; a renamed feature keeps its values and
stats; a frame without a value, a key the source lacks, or a bad name is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.writers.edit import EditSpec, edit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CLI = [sys.executable, "-m", "episodekit.cli"]
SRC = FIXTURES / "rec40"


def keys() -> tuple[np.ndarray, np.ndarray]:
    ds = open_dataset(str(SRC))
    ep = np.repeat(ds.column("episode_index"), ds.column("length"))
    fi = np.concatenate([np.arange(n) for n in ds.column("length")])
    return ep, fi


def rows(root: Path) -> pa.Table:
    ds = open_dataset(str(root))
    return pa.concat_tables(pq.read_table(ds.join(f)) for f in ds.data_files)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("values")
    ep, fi = keys()
    order = np.random.default_rng(0).permutation(len(ep))  # any row order
    reward = (ep * 1000 + fi).astype(np.float32)
    pq.write_table(pa.table({"episode_index": ep[order], "frame_index": fi[order],
                             "value": reward[order]}), tmp / "reward.parquet")  # fmt: skip
    np.save(tmp / "progress.npy", np.stack([ep, fi, fi / 10.0, -ep * 1.0], axis=1))
    with open(tmp / "success.jsonl", "w") as fh:
        for e, f in zip(ep.tolist(), fi.tolist()):
            fh.write(json.dumps({"episode_index": e, "frame_index": f, "success": f > 50}) + "\n")
    return tmp


@pytest.fixture(scope="module")
def added(files, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("added") / "out"
    spec = EditSpec(
        add_features=(("next.reward", str(files / "reward.parquet")),
                      ("progress", str(files / "progress.npy")),
                      ("success", str(files / "success.jsonl"))),
        rename_features=(("observation.state", "observation.joints"),),
        drop_episodes=(5,),
    )  # fmt: skip
    r = edit(str(SRC), out, spec)
    assert r.write.status == "written" and r.write.stats.startswith(
        "computed while writing (3 added features)"
    )
    return out


def test_added_columns_hold_the_files_values(added):
    b, a = rows(added), rows(SRC)
    a = a.filter(pa.array(a["episode_index"].to_numpy() != 5))
    ep, fi = a["episode_index"].to_numpy(), a["frame_index"].to_numpy()
    np.testing.assert_array_equal(b["next.reward"].to_numpy(), (ep * 1000 + fi).astype(np.float32))
    prog = np.stack(b["progress"].to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(prog, np.stack([fi / 10.0, -ep * 1.0], axis=1))
    np.testing.assert_array_equal(b["success"].to_numpy(zero_copy_only=False), fi > 50)
    assert b["observation.joints"].equals(a["observation.state"])
    assert "observation.state" not in b.column_names
    for name in ("action", "timestamp", "frame_index"):
        assert b[name].equals(a[name]), name


def test_new_and_renamed_features_are_declared_with_stats(added):
    info = json.loads((added / "meta/info.json").read_text())["features"]
    assert info["next.reward"] == {"dtype": "float32", "shape": [1], "names": None}
    assert info["progress"] == {"dtype": "float64", "shape": [2], "names": None}
    assert info["success"]["dtype"] == "bool"
    assert "observation.state" not in info and info["observation.joints"]["shape"] == [14]
    hf = json.loads(pq.read_schema(next((added / "data").rglob("*.parquet"))).metadata[
        b"huggingface"])["info"]["features"]  # fmt: skip
    assert hf["progress"] == {"feature": {"dtype": "float64", "_type": "Value"}, "length": 2,
                              "_type": "List"}  # fmt: skip
    assert "observation.joints" in hf and "observation.state" not in hf
    meta = pq.read_table(added / "meta/episodes/chunk-000/file-000.parquet")
    assert "stats/observation.state/mean" not in meta.column_names
    row = meta.slice(0, 1).to_pylist()[0]
    n = row["length"]
    assert row["stats/next.reward/max"] == [float(n - 1)] and row["stats/progress/min"] == [0, 0]
    assert row["stats/observation.joints/count"] == [n]
    stats = json.loads((added / "meta/stats.json").read_text())
    assert "observation.joints" in stats and "observation.state" not in stats
    assert stats["next.reward"]["count"] == [int(meta["length"].to_numpy().sum())]
    v = subprocess.run([*CLI, "validate", str(added), "--json"], capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert v.returncode == 0 and json.loads(v.stdout)["counts"]["error"] == 0, v.stdout


def test_rerun_is_a_no_op_and_other_values_are_another_output(files, tmp_path):
    spec = EditSpec(add_features=(("next.reward", str(files / "reward.parquet")),))
    assert edit(str(SRC), tmp_path / "o", spec).write.status == "written"
    assert edit(str(SRC), tmp_path / "o", spec).write.status == "unchanged"
    ep, fi = keys()
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"episode_index": ep, "frame_index": fi, "next.reward": fi * 2}), other)
    r = edit(str(SRC), tmp_path / "o", EditSpec(add_features=(("next.reward", str(other)),)))
    assert r.write.status == "written"
    np.testing.assert_array_equal(rows(tmp_path / "o")["next.reward"].to_numpy(), fi * 2)


def _values(tmp: Path, ep: np.ndarray, fi: np.ndarray) -> str:
    path = tmp / f"v{len(list(tmp.glob('v*.parquet')))}.parquet"
    pq.write_table(pa.table({"episode_index": ep, "frame_index": fi, "value": fi * 1.0}), path)
    return str(path)


@pytest.mark.parametrize(
    "case, words",
    [
        ("missing", "has no value for episode 0 frame 3 (every kept frame needs one)"),
        ("foreign", "episode 99 frame 0 is not a frame of"),
        ("twice", "episode 0 frame 0 has two values"),
        ("exists", "'action' is already a feature"),
        ("no-from", "give one --from FILE for each --add-feature NAME"),
        ("rename-unknown", "--rename-feature nope=x: no feature 'nope'"),
        ("rename-required", "LeRobot datasets need that column under its name"),
    ],
)
def test_cli_bad_features_are_one_line_exit_2(case, words, tmp_path):
    ep, fi = keys()
    args = {
        "missing": ["--add-feature", "r", "--from",
                    _values(tmp_path, np.delete(ep, 3), np.delete(fi, 3))],
        "foreign": ["--add-feature", "r", "--from",
                    _values(tmp_path, np.r_[ep, 99], np.r_[fi, 0])],
        "twice": ["--add-feature", "r", "--from", _values(tmp_path, np.r_[ep, 0], np.r_[fi, 0])],
        "exists": ["--add-feature", "action", "--from", _values(tmp_path, ep, fi)],
        "no-from": ["--add-feature", "r"],
        "rename-unknown": ["--rename-feature", "nope=x"],
        "rename-required": ["--rename-feature", "timestamp=t"],
    }[case]  # fmt: skip
    r = subprocess.run([*CLI, "edit", str(SRC), "--out", str(tmp_path / "o"), *args],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 2, (r.returncode, r.stderr)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error")]
    assert len(errors) == 1 and words in errors[0] and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()
