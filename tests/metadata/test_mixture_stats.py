"""Mixture stats (issue 18, ``metadata stats --mixture``): weighted as sampled, checked against
numpy over the sources' frames repeated by their repeats; filters, padding, halves = whole,
freshness and staleness naming the source, the CLI as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.metadata.mixture.spec import MixtureError
from episodekit.metadata.mixture.stats import (
    MIXTURE_STATS_FILE,
    MIXTURE_STATS_META,
    compute_mixture_stats,
    ensure_mixture_stats,
    load_mixture_stats,
    mixture_stats_stale_reason,
)
from episodekit.metadata.stats import QUANTILE_KEYS, QUANTILES, compute_stats
from episodekit.sample import write_sample


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("mixstats")
    a = write_sample(base / "a", episodes=4, tasks=2, seed=1, mean_length=10, state_dim=3)
    b = write_sample(base / "b", episodes=6, tasks=2, seed=2, mean_length=8, state_dim=6)
    whole = write_sample(
        base / "w", episodes=12, tasks=3, seed=3, mean_length=15, data_files_size_in_mb=0.01
    )
    return a, b, whole


def _rows(root: Path, name: str, episodes=None) -> np.ndarray:
    """``name`` of ``root``'s frames (of ``episodes``), as (n, D) float64, in file order."""
    t = pq.read_table(sorted((Path(root) / "data").rglob("*.parquet")))
    col = t[name].combine_chunks()
    flat = col.values if pa.types.is_fixed_size_list(col.type) else col
    values = flat.to_numpy().reshape(t.num_rows, -1).astype(np.float64)
    if episodes is not None:
        values = values[np.isin(t["episode_index"].to_numpy(), episodes)]
    return values


def _frames(root: Path, episodes=None) -> int:
    return len(_rows(root, "index", episodes))


def _expected(x: np.ndarray) -> dict[str, np.ndarray]:
    out = {
        "min": x.min(0),
        "max": x.max(0),
        "mean": x.mean(0),
        "std": x.std(0),
        "count": np.array([len(x)]),
    }
    q = np.quantile(x, QUANTILES, axis=0)
    for i, k in enumerate(QUANTILE_KEYS):
        out[k] = q[i]
    return out


def _assert_stats(got: dict, want: dict) -> None:
    for k in ("min", "max", "count", *QUANTILE_KEYS):  # order statistics: bit for bit
        np.testing.assert_array_equal(np.asarray(got[k]), want[k], err_msg=k)
    np.testing.assert_allclose(got["mean"], want["mean"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["std"], want["std"], rtol=1e-10, atol=1e-12)


def _weighted_spec(a, b, **extra):
    """a drawn 3x (weight 3, frames balance, epoch 3 Fa + Fb): quotas exactly 3 Fa and Fb;
    b restricted to episodes 1..3 and tasks filter-free."""
    fa, fb = _frames(a), _frames(b, [1, 2, 3])
    return {
        "sources": [
            {"root": str(a), "weight": 3},
            {"root": str(b), "weight": 1, "episodes": "1:4", "name": "bee"},
        ],
        "balance": "frames",
        "epoch_frames": 3 * fa + fb,
        "features": {"observation.state": {"pad_to": 8}, "task_index": {"drop": True}},
        **extra,
    }


def test_weighted_stats_equal_numpy_over_the_repeated_frames(roots, tmp_path):
    a, b, _ = roots
    report = ensure_mixture_stats(_weighted_spec(a, b), tmp_path / "p")
    assert report["status"] == "written"
    fa, fb = _frames(a), _frames(b, [1, 2, 3])
    assert [s["quota"] for s in report["sources"]] == [3 * fa, fb]
    assert [s["repeats"] for s in report["sources"]] == [3.0, 1.0]
    stats = json.loads((tmp_path / "p" / MIXTURE_STATS_FILE).read_text())
    assert "task_index" not in stats  # dropped by the mixture's feature mapping
    for name in ("action", "timestamp", "frame_index", "index"):
        x = np.concatenate([np.tile(_rows(a, name), (3, 1)), _rows(b, name, [1, 2, 3])])
        _assert_stats(stats[name], _expected(x))
    # pad_to 8: dims 0-2 from a (x3) and b, dims 3-5 from b only, dims 6-7 padding (0)
    sa, sb = _rows(a, "observation.state"), _rows(b, "observation.state", [1, 2, 3])
    got = stats["observation.state"]
    assert all(len(got[k]) == 8 for k in ("min", "mean", "q50")) and got["count"] == [3 * fa + fb]
    low = {k: np.asarray(v)[:3] for k, v in got.items() if k != "count"}
    high = {k: np.asarray(v)[3:6] for k, v in got.items() if k != "count"}
    want_low = _expected(np.concatenate([np.tile(sa, (3, 1)), sb[:, :3]]))
    want_high = _expected(sb[:, 3:])
    _assert_stats({**low, "count": got["count"]}, want_low)
    _assert_stats({**high, "count": [fb]}, want_high)
    assert all(np.asarray(v)[6:].tolist() == [0, 0] for k, v in got.items() if k != "count")
    meta = json.loads((tmp_path / "p" / MIXTURE_STATS_META).read_text())
    state = meta["features"]["observation.state"]
    assert state["dim_count"] == [3 * fa + fb] * 3 + [fb] * 3 + [0, 0]
    assert state["quantiles"] == "exact" and state["rank_error"] == 0
    assert [s["name"] for s in meta["sources"]] == ["a", "bee"]
    assert all(len(s["fingerprint"]) and len(s["data_state"]) for s in meta["sources"])


def test_tasks_filter_is_honoured(roots, tmp_path):
    a, b, _ = roots
    from episodekit.core.dataset import open_dataset

    ds = open_dataset(str(b))
    task = ds.task_strings()[0]
    keep = ds.column("episode_index")[[task in t for t in ds.episodes.column("tasks").to_pylist()]]
    assert 0 < len(keep) < ds.num_episodes
    spec = {"sources": [{"root": str(b), "weight": 1, "tasks": [task]}]}
    res = compute_mixture_stats(spec, features=["action"])
    _assert_stats(res.stats["action"], _expected(_rows(b, "action", keep)))


def test_sketch_mode_within_its_rank_bound(roots):
    a, b, _ = roots
    res = compute_mixture_stats(_weighted_spec(a, b), features=["action"], memory_mb=1e-6,
                                sketch_points=4)  # fmt: skip
    f = res.meta["features"]["action"]
    assert f["quantiles"] == "sketch" and 0 < f["rank_error"] < 1
    x = np.sort(
        np.concatenate([np.tile(_rows(a, "action"), (3, 1)), _rows(b, "action", [1, 2, 3])]), 0
    )
    n = len(x)
    err = f["rank_error"] * n
    for k, q in zip(QUANTILE_KEYS, QUANTILES):
        lo = x[max(int(np.floor((n - 1) * q - err)), 0)]
        hi = x[min(int(np.ceil((n - 1) * q + err)), n - 1)]
        got = np.asarray(res.stats["action"][k])
        assert np.all((lo <= got) & (got <= hi)), k


def test_halves_as_sources_equal_the_whole(roots):
    _, _, whole = roots
    spec = {
        "sources": [
            {"root": str(whole), "weight": 1, "episodes": "0:5", "name": "h1"},
            {"root": str(whole), "weight": 1, "episodes": "5:12", "name": "h2"},
        ],
        "balance": "frames",  # quota = frames: every frame counts once, as in the whole
    }
    res = compute_mixture_stats(spec)
    ref = compute_stats(str(whole)).lerobot_stats()
    assert set(res.stats) == set(ref)
    for name in ref:
        _assert_stats(res.stats[name], {k: np.asarray(v) for k, v in ref[name].items()})


def test_rerun_keeps_fresh_and_a_changed_source_is_named(roots, tmp_path):
    a, b0, _ = roots
    b = tmp_path / "b"
    write_sample(b, episodes=6, tasks=2, seed=2, mean_length=8, state_dim=6)
    spec = _weighted_spec(a, b)
    out = tmp_path / "p"
    ensure_mixture_stats(spec, out)
    files = [out / MIXTURE_STATS_FILE, out / MIXTURE_STATS_META]
    before = [f.stat().st_mtime_ns for f in files]
    again = ensure_mixture_stats(spec, out)
    assert again["status"] == "fresh" and [f.stat().st_mtime_ns for f in files] == before
    assert load_mixture_stats(out)["action"]["mean"].shape == (14,)
    # change source b's data: action values doubled
    path = sorted((b / "data").rglob("*.parquet"))[0]
    t = pq.read_table(path)
    i = t.schema.get_field_index("action")
    col = t["action"].combine_chunks()
    doubled = pa.FixedSizeListArray.from_arrays(pa.compute.multiply(col.values, 2), 14)
    pq.write_table(t.set_column(i, t.schema.field("action"), doubled), path)
    reason = mixture_stats_stale_reason(out, spec)
    assert "source 'bee'" in reason and "data files" in reason
    with pytest.raises(MixtureError, match="stale: source 'bee' changed"):
        load_mixture_stats(out)
    redo = ensure_mixture_stats(spec, out)
    assert redo["status"] == "written" and "source 'bee'" in redo["reason"]
    assert mixture_stats_stale_reason(out, spec) == ""
    # an edited stats.json or another spec is stale too
    (out / MIXTURE_STATS_FILE).write_text("{}")
    assert "edited" in mixture_stats_stale_reason(out, spec)
    assert "spec changed" in mixture_stats_stale_reason(out, {**spec, "epoch_frames": 10})
    # stats of some features only are not fresh for all of them
    ensure_mixture_stats(spec, out, features=["action"])
    assert mixture_stats_stale_reason(out, spec, features=["action"]) == ""
    assert "features missing" in mixture_stats_stale_reason(out, spec)


def test_feature_mapping_errors(roots, tmp_path):
    a, b, _ = roots
    spec = {"sources": [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 1}]}
    with pytest.raises(
        MixtureError, match="observation.state.*declare features.observation.state.pad_to"
    ):
        compute_mixture_stats(spec)
    renamed = {
        "sources": [
            {"root": str(a), "weight": 1, "rename": {"observation.state": "obs"}},
            {"root": str(b), "weight": 1},
        ],
        "features": {"observation.state": {"pad_to": 6}},
    }
    with pytest.raises(MixtureError, match="source 'b' has no feature 'obs'"):
        compute_mixture_stats(renamed)
    with pytest.raises(ValueError, match="nope"):
        compute_mixture_stats(
            {**spec, "features": {"observation.state": {"pad_to": 6}}}, features=["nope"]
        )


# --------------------------------------------------------------------------------------------
# CLI, as a user runs it


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "episodekit.cli", *args], capture_output=True, text=True
    )


def test_cli_mixture_stats(roots, tmp_path):
    a, _, _ = roots
    b = tmp_path / "b"
    write_sample(b, episodes=6, tasks=2, seed=2, mean_length=8, state_dim=6)
    m = tmp_path / "m.json"
    m.write_text(json.dumps(_weighted_spec(a, b)))
    out = tmp_path / "p"
    r = run_cli("metadata", "stats", "--mixture", str(m), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "written" in r.stdout and "bee" in r.stdout and (out / "stats.json").exists()
    r = run_cli("metadata", "stats", "--mixture", str(m), "--out", str(out), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "fresh"
    r = run_cli("metadata", "stats", "--mixture", str(m))
    assert r.returncode == 2 and "--out" in r.stderr
    r = run_cli("metadata", "stats", str(a), "--mixture", str(m), "--out", str(out))
    assert r.returncode == 2 and "not both" in r.stderr
    r = run_cli("metadata", "stats", "--mixture", str(m), "--out", str(out), "--features", "nope")
    assert r.returncode == 2 and "nope" in r.stderr
    r = run_cli("metadata", "stats", "--mixture", str(m), "--out", str(out), "--executor", "ray")
    assert r.returncode == 2 and "--executor is for ROOT" in r.stderr  # not silently local
    bad = '{"sources": [{"root": "' + str(a) + '", "weight": 0}]}'
    r = run_cli("metadata", "stats", "--mixture", bad, "--out", str(out))
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0
    assert "sources[0].weight" in r.stderr
    # a source's data file goes missing: one line naming the source, exit 1
    path = sorted((b / "data").rglob("*.parquet"))[0]
    path.rename(path.with_suffix(".bak"))
    r = run_cli("metadata", "stats", "--mixture", str(m), "--out", str(out))
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0
    assert "source 'bee'" in r.stderr
    path.with_suffix(".bak").rename(path)
    # a changed source: the rerun recomputes and says which one
    t = pq.read_table(path)
    pq.write_table(t.slice(0, t.num_rows), path, row_group_size=7)
    r = run_cli("metadata", "stats", "--mixture", str(m), "--out", str(out))
    assert r.returncode == 0 and "source 'bee' changed" in r.stdout
