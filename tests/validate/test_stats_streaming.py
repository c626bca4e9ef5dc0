"""``stats.*`` checks read meta/episodes one file at a time: the findings must be those of the
whole table (first offending episode in episode order, keys dropped anywhere left out of the order
checks everywhere, consistency against the merge of every file), as if the episodes sat in one
file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.metadata.stats import STATS_FILE, ensure_stats, numeric_features
from episodekit.metadata.stats.episode_merge import EpisodeMerge
from episodekit.validate import stats as checks_stats
from episodekit.validate.raw import read_raw
from episodekit.validate.stats_episodes import episode_part

SPEC = {"episodes": 24, "tasks": 3, "seed": 11, "data_files_size_in_mb": 0.06}


def _files(root: Path) -> list[Path]:
    return sorted((root / "meta/episodes").rglob("*.parquet"))


@pytest.fixture
def multi(make_sample) -> Path:
    """24 episodes whose meta/episodes rows are spread over several files, stats written."""
    root = make_sample(**SPEC)
    ensure_stats(root, jobs=1)
    assert len(_files(root)) >= 4
    return root


def _one_file(root: Path) -> None:
    """Move every episodes row into one file (same rows, same order)."""
    files = _files(root)
    t = pa.concat_tables([pq.read_table(f) for f in files])
    for f in files:
        f.unlink()
    pq.write_table(t, files[0])


def _edit(root: Path, file: int, column: str, row: int, fn) -> int:
    """Apply ``fn`` to one episode's value of a stats column in the ``file``-th episodes file
    (0 = first); returns that episode's index."""
    f = _files(root)[file]
    t = pq.read_table(f)
    vals = t[column].to_pylist()
    vals[row] = fn(vals[row])
    i = t.schema.get_field_index(column)
    pq.write_table(t.set_column(i, column, pa.array(vals, t.schema.field(i).type)), f)
    return int(t["episode_index"][row].as_py())


def _findings(root: Path, deep: bool = False) -> list[dict]:
    return [f.to_dict() for f in checks_stats.check_stats(read_raw(str(root)), deep=deep)]


def _nan_first(v):
    return [float("nan"), *v[1:]]


def _plus(d: float):
    return lambda v: [x + d for x in v]


def test_corruption_in_the_second_file_names_its_episode(multi):
    assert _findings(multi) == []
    ep = _edit(multi, 1, "stats/action/mean", 2, _nan_first)
    found = _findings(multi)
    assert [(f["check"], f["episode"]) for f in found] == [("stats.finite", ep)]
    assert found[0]["message"] == "stats/action/mean: 1 episode with NaN/inf"


def test_first_offending_episode_across_files(multi):
    later = _edit(multi, 3, "stats/action/min", 0, _plus(1e6))  # min > q01 .. in file 4
    earlier = _edit(multi, 1, "stats/action/max", 1, _plus(-1e6))  # q99 > max in file 2
    count_ep = _edit(multi, 2, "stats/action/count", 1, lambda v: [v[0] + 2])
    found = {f["check"]: f for f in _findings(multi)}
    assert earlier < later
    assert found["stats.order"]["episode"] == earlier
    assert found["stats.order"]["message"].startswith(
        "stats/action: 2 episodes with min > q01, q99 > max, mean outside [min, max]"
    )
    length = pq.read_table(_files(multi)[2])["length"].to_pylist()[1]
    assert found["stats.count"]["episode"] == count_ep
    assert found["stats.count"]["message"] == (
        f"stats/action/count: 1 episode whose count is not their length "
        f"(e.g. {length + 2} vs {length})"
    )


CORRUPTIONS = {
    # a NaN q10 in the last file drops q10 from the order checks of every file: the q10 > q50 of
    # an episode of the first file is then no finding, its q50 > q90 still is
    "dropped_key": [
        (-1, "stats/action/q10", 0, _nan_first),
        (0, "stats/action/q10", 2, _plus(1e6)),
        (0, "stats/action/q50", 1, _plus(1e6)),
    ],
    "order_and_count": [
        (2, "stats/observation.state/q90", 1, _plus(-1e6)),
        (1, "stats/observation.state/q90", 0, _plus(-1e6)),
        (3, "stats/action/count", 0, lambda v: [v[0] - 1]),
    ],
    "episode_mean_off": [(2, "stats/action/mean", 1, _plus(0.25))],
    "misshapen_in_one_file": [(1, "stats/action/q50", 0, lambda v: v[:-1])],
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_several_files_find_what_one_file_finds(make_sample, name):
    roots = []
    for one in (False, True):
        root = make_sample(**SPEC)
        ensure_stats(root, jobs=1)
        eps = [_edit(root, f, c, r, fn) for f, c, r, fn in CORRUPTIONS[name]]
        if one:
            _one_file(root)
        roots.append((root, eps))
    (many, eps), (single, same_eps) = roots
    assert eps == same_eps
    found = _findings(many)
    assert found, name

    def anywhere(fs):  # a shape finding names the episodes file it is in
        return [{**f, "file": None} if f["check"] == "stats.shape" else f for f in fs]

    assert anywhere(found) == anywhere(_findings(single))
    if name == "dropped_key":
        order = [f for f in found if f["check"] == "stats.order"]
        assert len(order) == 1 and "q50 > q90" in order[0]["message"]
        assert "q10" not in order[0]["message"] and order[0]["episode"] == eps[2]
        assert [f["episode"] for f in found if f["check"] == "stats.finite"] == [eps[0]]
    if name == "episode_mean_off":  # the merge of the files no longer gives stats.json's mean
        assert any(
            f["check"] == "stats.consistent" and f["message"].startswith("action/mean")
            for f in found
        )


def test_consistency_against_the_merge_of_every_file(multi):
    data = json.loads((multi / STATS_FILE).read_text())
    data["action"]["std"][3] *= 1.001
    (multi / STATS_FILE).write_text(json.dumps(data))
    found = _findings(multi)
    assert [(f["check"], f["message"].split(":")[0]) for f in found] == [
        ("stats.consistent", "action/std")
    ]
    assert "in dimension 3" in found[0]["message"]


def test_deep_on_several_files(multi):
    assert _findings(multi, deep=True) == []
    ep = _edit(multi, 2, "stats/action/q50", 1, _plus(1e-3))
    found = _findings(multi, deep=True)
    assert [(f["check"], f["episode"]) for f in found] == [("stats.recompute", ep)]


def test_per_episode_values_kept_only_for_deep(multi):
    raw = read_raw(str(multi))
    feats = numeric_features(raw.info)
    assert episode_part(raw, feats).episodes == {}
    deep = episode_part(raw, feats, keep=True)
    assert deep.episodes["action"]["mean"].shape == (24, 14)
    np.testing.assert_array_equal(deep.ep, np.arange(24))


def _merge_all(got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The merge of every episode at once (the formula of the whole table)."""
    w = got["count"][:, 0]
    mean = (got["mean"] * w[:, None]).sum(0) / w.sum()
    var = ((got["std"] ** 2 + (got["mean"] - mean) ** 2) * w[:, None]).sum(0) / w.sum()
    return {"mean": mean, "std": np.sqrt(var), "count": np.array([w.sum()])}


def test_merge_of_chunks_is_the_merge_of_all():
    rng = np.random.default_rng(0)
    n = 500
    got = {
        "count": rng.integers(0, 400, (n, 1)).astype(np.float64),
        "mean": 1e6 + rng.standard_normal((n, 3)),  # large offset, small spread
        "std": rng.random((n, 3)) * 1e-2,
    }
    got["min"], got["max"] = got["mean"] - 1, got["mean"] + 1
    got["count"][:40] = 0  # a chunk of episodes without frames adds only to min/max
    merge = EpisodeMerge()
    for a, b in ((0, 40), (40, 41), (41, 300), (300, 300), (300, n)):
        merge.add({k: v[a:b] for k, v in got.items()})
    res = merge.merged()
    want = _merge_all(got)
    np.testing.assert_allclose(res["mean"], want["mean"], rtol=1e-14)
    np.testing.assert_allclose(res["std"], want["std"], rtol=1e-9)
    assert res["count"][0] == want["count"][0]
    np.testing.assert_array_equal(res["min"], got["min"].min(0))
    np.testing.assert_array_equal(res["max"], got["max"].max(0))
    empty = EpisodeMerge()
    empty.add({k: v[:40] for k, v in got.items()})
    assert empty.merged() is None  # no frames to weigh: nothing to compare


def test_one_column_read_at_a_time_and_one_dataset_per_run(multi, monkeypatch):
    """The driver's transient under ``prepare --executor ray`` (issue 49): a feature's stats
    columns are read one per call, and a validate run builds the root's Dataset once (the
    artifact checks' and the stats pass's), with the same findings."""
    import pyarrow.parquet as pq_mod

    from episodekit.validate import artifacts
    from episodekit.validate.runner import validate

    before = validate(str(multi), checks="stats,speed").to_dict()["findings"]
    widths, built = [], []
    read = pq_mod.ParquetFile.read

    def one_read(self, columns=None, **kw):
        if columns and all(c.startswith("stats/") for c in columns):
            widths.append(len(columns))
        return read(self, columns=columns, **kw)

    make = artifacts.dataset_from_raw

    def counted(raw):
        built.append(1)
        return make(raw)

    monkeypatch.setattr(pq_mod.ParquetFile, "read", one_read)
    monkeypatch.setattr(artifacts, "dataset_from_raw", counted)
    monkeypatch.setattr(checks_stats, "dataset_from_raw", counted)
    after = validate(str(multi), checks="stats,speed").to_dict()["findings"]
    assert after == before
    assert widths and max(widths) == 1
    assert len(built) == 1
