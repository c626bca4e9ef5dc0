"""``validate --deep`` on a LeRobot-written root whose stats.json quantiles are the data's exact
quantiles (what ``repair`` writes, with no sketch sidecar): accepted; other values are not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.metadata.stats import QUANTILE_KEYS, QUANTILES, STATS_FILE
from episodekit.validate import stats as checks_stats
from episodekit.validate.raw import read_raw

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / "rec40"
FEATURE = "observation.state"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURE, tmp_path / "rec40"))


def _exact(root: Path) -> np.ndarray:
    t = pa.concat_tables(pq.read_table(f, columns=[FEATURE]) for f in root.glob("data/*/*.parquet"))
    x = np.stack(t[FEATURE].to_numpy(zero_copy_only=False)).astype(np.float64)
    return np.quantile(x, QUANTILES, axis=0)


def _set_quantiles(root: Path, q: np.ndarray) -> None:
    path = root / STATS_FILE
    stats = json.loads(path.read_text())
    for i, k in enumerate(QUANTILE_KEYS):
        stats[FEATURE][k] = q[i].tolist()
    path.write_text(json.dumps(stats, indent=4))


def _recompute(root: Path) -> list[str]:
    found = checks_stats.check_stats(read_raw(str(root)), deep=True)
    return [f.message for f in found if f.check == "stats.recompute" and f.severity == "error"]


def test_lerobot_written_root_passes(root):
    assert _recompute(root) == []


def test_exact_data_quantiles_pass(root):
    q = _exact(root)
    stats = json.loads((root / STATS_FILE).read_text())
    assert not np.allclose(q, [stats[FEATURE][k] for k in QUANTILE_KEYS])  # not LeRobot's
    _set_quantiles(root, q)
    assert _recompute(root) == []


def test_other_quantiles_fail(root):
    q = _exact(root)
    span = q[-1] - q[0]
    q[2] += 0.05 * span  # the median moved by 5% of the q01..q99 span
    _set_quantiles(root, q)
    found = _recompute(root)
    assert len(found) == 1 and found[0].startswith(f"{FEATURE}/q50:"), found
