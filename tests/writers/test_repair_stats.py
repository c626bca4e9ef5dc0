"""stats.json as LeRobot's recorder writes it (``repair_schema.lerobot_dataset_stats``): the
recorder aggregates after every episode, ``stats = aggregate_stats([stats, episode_stats])``;
repair rebuilds that, bit for bit, in one float64 recurrence over every feature at once.

Checked against the stats.json LeRobot 0.6.1 itself wrote (rec40, lang5: every key equal) and
against LeRobot's pairwise ``aggregate_feature_stats`` step by step (below, numpy for numpy) on
every LeRobot-written fixture and on made-up episodes of every dtype kind, one-frame episodes
and images included."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.metadata import lerobot_stats
from episodekit.writers import repair_schema as rs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"


def _pairwise(a: dict, b: dict) -> dict:
    """LeRobot 0.6.1 ``aggregate_feature_stats([a, b])`` (compute_stats.py), numpy for numpy."""
    stats = [a, b]
    means = np.stack([s["mean"] for s in stats])
    variances = np.stack([s["std"] ** 2 for s in stats])
    counts = np.stack([s["count"] for s in stats])
    total = counts.sum(axis=0)
    while counts.ndim < means.ndim:
        counts = np.expand_dims(counts, axis=-1)
    mean = (means * counts).sum(axis=0) / total
    variance = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
    out = {
        "min": np.min(np.stack([s["min"] for s in stats]), axis=0),
        "max": np.max(np.stack([s["max"] for s in stats]), axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": total,
    }
    for q in lerobot_stats.LEROBOT_QUANTILE_KEYS:
        out[q] = (np.stack([s[q] for s in stats]) * counts).sum(axis=0) / total
    return out


def _held(feature: dict, row: dict, name: str) -> dict:
    """One episode's stats in the dtypes the recorder holds them in."""
    dtype = feature.get("dtype")
    base = np.float32 if dtype in ("image", "video") else np.result_type(dtype, np.float32)
    base = np.float64 if name == "timestamp" else base
    count = np.asarray(row[f"stats/{name}/count"], dtype=np.int64)
    out = {"count": count}
    for k in rs.STAT_KEYS:
        if k != "count":
            exact = k in ("min", "max", "mean", "std") or int(count[0]) < 2
            out[k] = np.asarray(row[f"stats/{name}/{k}"], dtype=base if exact else np.float64)
    return out


def reference(info: dict, table: pa.Table) -> dict:
    """The recorder's loop: one pairwise aggregation per episode and feature."""
    rows = table.to_pylist()
    out = {}
    for name in rs.stats_features(info):
        if f"stats/{name}/count" not in table.column_names:
            continue
        acc = _held(info["features"][name], rows[0], name)
        for row in rows[1:]:
            acc = _pairwise(acc, _held(info["features"][name], row, name))
        out[name] = {k: np.asarray(acc[k]).tolist() for k in rs.STAT_KEYS}
    return out


def _episodes(root: Path) -> pa.Table:
    files = sorted((root / "meta/episodes").glob("*/*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]).sort_by("episode_index")


@pytest.mark.parametrize("name", ["rec40", "lang5"])
def test_equals_the_stats_json_lerobot_wrote(name):
    root = FIXTURES / name
    info = json.loads((root / "meta/info.json").read_text())
    got = rs.lerobot_dataset_stats(info, _episodes(root))
    want = json.loads((root / "meta/stats.json").read_text())
    assert got and got == {k: want[k] for k in got}


@pytest.mark.parametrize("name", ["rec40", "vid24", "edited35", "lang5"])
def test_equals_lerobot_pairwise_steps_on_every_prefix_length(name):
    root = FIXTURES / name
    info = json.loads((root / "meta/info.json").read_text())
    table = _episodes(root)
    for n in (1, 2, 3, table.num_rows):
        part = table.slice(0, n)
        assert json.dumps(rs.lerobot_dataset_stats(info, part)) == json.dumps(reference(info, part))


def _made_up(n: int, seed: int) -> tuple[dict, pa.Table]:
    """Episodes of a float32 vector, an int64 scalar, float64 timestamps and a (3, 1, 1) image;
    some one frame long (their quantiles in their own type), counts of images their own."""
    rng = np.random.default_rng(seed)
    features = {
        "action": {"dtype": "float32", "shape": [5]},
        "task_index": {"dtype": "int64", "shape": [1]},
        "timestamp": {"dtype": "float32", "shape": [1]},
        "observation.images.top": {"dtype": "video", "shape": [8, 8, 3]},
    }
    info = {"features": features}
    rows = []
    for i in range(n):
        length = 1 if i % 4 == 1 else int(rng.integers(2, 500))
        row = {"episode_index": i}
        for name, f in features.items():
            shape = (3, 1, 1) if f["dtype"] == "video" else (f["shape"][0],)
            count = int(rng.integers(1, 40)) if f["dtype"] == "video" else length
            for k in rs.STAT_KEYS:
                v = rng.normal(size=shape) * 10 ** rng.uniform(-3, 3)
                row[f"stats/{name}/{k}"] = [count] if k == "count" else np.abs(v).tolist()
        rows.append(row)
    return info, pa.Table.from_pylist(rows)


@pytest.mark.parametrize("seed", [0, 1])
def test_equals_lerobot_pairwise_steps_on_every_kind_of_feature(seed):
    info, table = _made_up(57, seed)
    got = rs.lerobot_dataset_stats(info, table)
    assert set(got) == set(info["features"])
    assert json.dumps(got) == json.dumps(reference(info, table))
    rows = table.to_pylist()  # rows as the recorder's dicts give the same
    assert json.dumps(rs.lerobot_dataset_stats(info, rows[:3])) == json.dumps(
        reference(info, table.slice(0, 3))
    )


def test_ragged_stats_are_refused():
    info, table = _made_up(4, 0)
    col = [[1.0, 2.0]] * 3 + [[1.0]]
    name = "stats/task_index/min"
    table = table.set_column(table.schema.get_field_index(name), name, pa.array(col))
    with pytest.raises(ValueError, match="different shapes"):
        rs.lerobot_dataset_stats(info, table)


@pytest.mark.parametrize("block", [1, 2, 5, 56, 57, 1000])
def test_stats_taken_a_block_of_episodes_at_a_time_are_the_same(block):
    """The recurrence carried across blocks gives the same bytes as one block of every
    episode (memory: one block's arrays), and a shape that changes between blocks is
    refused as a ragged one is."""
    info, table = _made_up(57, 3)
    whole = rs.lerobot_dataset_stats(info, table, block=10**6)
    assert json.dumps(rs.lerobot_dataset_stats(info, table, block=block)) == json.dumps(whole)
    assert json.dumps(whole) == json.dumps(reference(info, table))
    one = table.slice(0, 1)
    assert json.dumps(rs.lerobot_dataset_stats(info, one, block=block)) == json.dumps(
        reference(info, one)
    )


def test_shapes_that_differ_between_blocks_are_refused():
    info, table = _made_up(4, 0)
    col = [[1.0, 2.0]] * 2 + [[1.0]] * 2
    for k in ("min", "max", "mean", "std", "q01", "q10", "q50", "q90", "q99"):
        name = f"stats/task_index/{k}"
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(col))
    with pytest.raises(ValueError, match="different shapes"):
        rs.lerobot_dataset_stats(info, table, block=2)
