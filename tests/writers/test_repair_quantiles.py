"""repair's stats.json quantiles are numpy's quantiles of the kept data, bit for bit (counted
while the verification decodes the rows, selected in one more pass); the rest of stats.json is
LeRobot's aggregation, and no sketch sidecar is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.metadata.stats import QUANTILE_KEYS, QUANTILES, STATS_FILE, numeric_features
from episodekit.metadata.stats.blocks import feature_values
from episodekit.metadata.stats.episode_sketch import SKETCHES_FILE
from episodekit.writers import repair_build
from episodekit.writers.repair import RepairOptions, repair

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"


def _exact(root: Path) -> dict[str, np.ndarray]:
    info = json.loads((root / "meta/info.json").read_text())
    feats = numeric_features(info)
    files = sorted(root.glob("data/*/*.parquet"))
    t = pa.concat_tables(pq.read_table(f, columns=list(feats)) for f in files)
    return {
        n: np.quantile(feature_values(t[n], d, n).astype(np.float64), QUANTILES, axis=0)
        for n, d in feats.items()
    }


@pytest.mark.parametrize("name", ["crash_rec7", "crash_vid5"])
def test_quantiles_are_numpys_of_the_kept_data(tmp_path, name):
    src = Path(shutil.copytree(FIXTURES / name, tmp_path / "src"))
    out = tmp_path / "out"
    repair(src, RepairOptions(out=str(out)))
    stats = json.loads((out / STATS_FILE).read_text())
    exact = _exact(out)
    assert exact
    for n, q in exact.items():
        got = np.array([stats[n][k] for k in QUANTILE_KEYS])
        np.testing.assert_array_equal(got, q, err_msg=n)
    assert not (out / SKETCHES_FILE).exists()


def test_a_wrong_recorded_range_changes_nothing(tmp_path, monkeypatch):
    """The range the counts use comes from the episodes' recorded min/max (untrusted: the
    crash left them); squeezed to a point it gives the same stats.json bytes."""
    src = Path(shutil.copytree(FIXTURES / "crash_rec7", tmp_path / "src"))
    repair(src, RepairOptions(out=str(tmp_path / "a")))
    real = repair_build.value_ranges

    def squeezed(plan, stats):
        return {n: (lo, lo) for n, (lo, _hi) in real(plan, stats).items()}

    monkeypatch.setattr(repair_build, "value_ranges", squeezed)
    repair(src, RepairOptions(out=str(tmp_path / "b")))
    a, b = ((tmp_path / d / STATS_FILE).read_bytes() for d in "ab")
    assert a == b
