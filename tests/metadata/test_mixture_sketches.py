"""Issue 36: a mixture's quantiles from its sources' per-episode sketches, weighted as sampled.

Sources: a copy of LeRobot-written ``rec40`` given our sketches (``metadata stats``), with an
episode filter; LeRobot-written ``edited35`` as LeRobot left it (no sketches: read once); our
own sample with sketches. Weights 3 / 1 / 0.5. Every quantile key is checked against the exact
weighted rank computed here with numpy over the concatenated frames (each frame of source ``i``
weighs ``quota_i / frames_i``); the sketched sources' data files are never opened."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import episodekit.metadata.mixture.stats as mixture_stats
from episodekit.core.dataset import open_dataset
from episodekit.metadata.mixture.stats import compute_mixture_stats
from episodekit.metadata.stats import QUANTILE_KEYS, QUANTILES, ensure_stats
from episodekit.metadata.stats.episode_sketch import SKETCHES_FILE
from episodekit.sample import write_sample

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
BOUND = 0.005
FEATURES = ["action", "observation.state"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("mixsketch")
    rec = base / "rec40"
    shutil.copytree(FIXTURES / "rec40", rec)
    ensure_stats(str(rec))
    ours = write_sample(base / "ours", episodes=30, seed=7, mean_length=120)
    ensure_stats(str(ours))
    edited = base / "edited35"
    shutil.copytree(FIXTURES / "edited35", edited)
    assert (rec / SKETCHES_FILE).exists() and (ours / SKETCHES_FILE).exists()
    assert not (edited / SKETCHES_FILE).exists()
    return {"rec": rec, "edited": edited, "ours": ours}


def _spec(src: dict[str, Path]) -> dict:
    return {
        "sources": [
            {"root": str(src["rec"]), "weight": 3, "episodes": "5:33", "name": "rec"},
            {"root": str(src["edited"]), "weight": 1, "name": "edited"},
            {"root": str(src["ours"]), "weight": 0.5, "name": "ours"},
        ],
        "balance": "frames",
    }


def _values(root: Path, name: str, episodes: list[int] | None) -> np.ndarray:
    t = pa.concat_tables(pq.read_table(f) for f in sorted((root / "data").rglob("*.parquet")))
    col = t[name].combine_chunks()
    x = col.values.to_numpy().reshape(t.num_rows, -1).astype(np.float64)
    if episodes is not None:
        x = x[np.isin(t["episode_index"].to_numpy(), episodes)]
    return x


def _weighted_frames(src, res, name) -> tuple[np.ndarray, np.ndarray]:
    """The sources' selected frames of ``name`` and each frame's weight (quota / frames)."""
    xs, ws = [], []
    for row in res.meta["sources"]:
        root = src[row["name"]]
        eps = list(range(5, 33)) if row["name"] == "rec" else None
        x = _values(root, name, eps)
        xs.append(x)
        ws.append(np.full(len(x), row["quota"] / len(x)))
    return np.concatenate(xs), np.concatenate(ws)


def _weighted_rank_errors(x: np.ndarray, w: np.ndarray, stats: dict) -> dict[str, float]:
    """Per quantile key, the worst dimension's distance in weighted rank from q:
    ``max(0, W(x < v) / W - q, q - W(x <= v) / W)``."""
    total = w.sum()
    out = {}
    for key, q in zip(QUANTILE_KEYS, QUANTILES):
        v = np.asarray(stats[key], np.float64)
        below = (w[:, None] * (x < v[None, :])).sum(0) / total
        at_most = (w[:, None] * (x <= v[None, :])).sum(0) / total
        out[key] = float(np.max(np.maximum(0.0, np.maximum(below - q, q - at_most))))
    return out


def test_mixture_quantiles_from_sketches_within_bound(sources, monkeypatch):
    opened: list[str] = []
    real = mixture_stats.open_data_file

    def spy(path, fs=None):
        opened.append(str(path))
        return real(path, fs)

    monkeypatch.setattr(mixture_stats, "open_data_file", spy)
    res = compute_mixture_stats(_spec(sources), features=FEATURES, quantiles="sketch")
    read = {row["name"]: row["read"] for row in res.meta["sources"]}
    assert read == {"rec": "sketches", "edited": "data", "ours": "sketches"}
    assert opened and all(str(sources["edited"]) in p for p in opened)  # only the unsketched one
    quotas = [row["quota"] for row in res.meta["sources"]]
    assert len(set(q / row["frames"] for q, row in zip(quotas, res.meta["sources"]))) == 3
    for name in FEATURES:
        x, w = _weighted_frames(sources, res, name)
        got = res.stats[name]
        errs = _weighted_rank_errors(x, w, got)
        assert max(errs.values()) <= BOUND, (name, errs)
        bound = res.meta["features"][name]["rank_error"]
        assert res.meta["features"][name]["quantiles"] == "sketch" and 0 < bound < BOUND
        mean = (w[:, None] * x).sum(0) / w.sum()
        std = np.sqrt((w[:, None] * (x - mean) ** 2).sum(0) / w.sum())
        np.testing.assert_allclose(got["mean"], mean, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(got["std"], std, rtol=1e-9, atol=1e-9)
        np.testing.assert_array_equal(got["min"], x.min(0))
        np.testing.assert_array_equal(got["max"], x.max(0))
        assert got["count"] == [sum(quotas)]


def test_exact_mode_reads_every_source_exactly(sources):
    res = compute_mixture_stats(_spec(sources), features=["action"], quantiles="exact")
    assert {row["read"] for row in res.meta["sources"]} == {"data"}
    assert res.meta["features"]["action"]["rank_error"] == 0
    x, w = _weighted_frames(sources, res, "action")
    worst = max(_weighted_rank_errors(x, w, res.stats["action"]).values())
    assert worst <= 2 * w.max() / w.sum()  # exact: within one frame's weight


def test_stale_sketches_are_not_used(sources, tmp_path):
    """A source whose data changed after its sketches were written is read, not sketched."""
    ours = tmp_path / "ours"
    shutil.copytree(sources["ours"], ours)
    ds = open_dataset(str(ours))
    f = ours / ds.data_files[0]
    t = pq.read_table(f)
    col = t["action"].combine_chunks()
    vals = col.values.to_numpy().copy()
    vals[0] += 1000.0  # one value moved far off: the sketches no longer describe the data
    arr = pa.FixedSizeListArray.from_arrays(pa.array(vals, col.type.value_type), col.type.list_size)
    pq.write_table(t.set_column(t.schema.get_field_index("action"), "action", arr), f)
    src = {**sources, "ours": ours}
    res = compute_mixture_stats(_spec(src), features=["action"], quantiles="sketch")
    read = {row["name"]: row["read"] for row in res.meta["sources"]}
    assert read == {"rec": "sketches", "edited": "data", "ours": "data"}
    x, w = _weighted_frames(src, res, "action")
    assert res.stats["action"]["max"] == x.max(0).tolist()  # the moved value is seen


def test_cli_mixture_stats_say_what_was_read(sources, tmp_path):
    import subprocess
    import sys

    spec = tmp_path / "mixture.json"
    spec.write_text(json.dumps(_spec(sources)))
    out = tmp_path / "plan"
    cmd = [sys.executable, "-m", "episodekit.cli", "metadata", "stats", "--mixture", str(spec)]
    p = subprocess.run(
        [*cmd, "--out", str(out), "--quantiles", "sketch", "--features", ",".join(FEATURES),
         "--json"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert [s["read"] for s in report["sources"]] == ["sketches", "data", "sketches"]
    stats = json.loads((out / "stats.json").read_text())
    assert set(stats) == set(FEATURES) and len(stats["action"]["q99"]) == 14
