"""Issue 36: every quantile key of every stats.json a command writes is within 0.005 in rank of
the data (exact ranks computed here with numpy, independently of the library), on datasets
LeRobot wrote and on our own outputs; ``validate --deep`` warns with the rank error on an
untouched LeRobot dataset (exit 0) and finds nothing on our outputs; ``edit`` with the source's
sketches present computes only the columns it renumbers."""

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
from episodekit.metadata.stats import QUANTILE_KEYS, QUANTILES, feature_values, numeric_features
from episodekit.metadata.stats.episode_sketch import SKETCHES_FILE, read_episode_sketches

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]
BOUND = 0.005


def cli(*args: str) -> subprocess.CompletedProcess:
    p = subprocess.run([*CLI, *args], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p


def exact_rank_errors(root: Path) -> dict[tuple[str, str], float]:
    """Per (feature, quantile key) of stats.json, the worst dimension's rank error against the
    data: ``max(0, #{x < v} - 1 - h, h - #{x <= v}) / N`` with ``h = (N - 1) q``."""
    ds = open_dataset(str(root))
    stats = json.loads((root / "meta/stats.json").read_text())
    table = pa.concat_tables(pq.read_table(ds.join(f)) for f in ds.data_files)
    out = {}
    for name, dims in numeric_features(ds.info).items():
        x = np.sort(feature_values(table[name], dims, name).astype(np.float64), axis=0)
        n = len(x)
        for key, q in zip(QUANTILE_KEYS, QUANTILES):
            if key not in stats.get(name, {}):
                continue
            v = np.asarray(stats[name][key], np.float64).reshape(dims)
            h = (n - 1) * q
            errs = []
            for d in range(dims):
                below = np.searchsorted(x[:, d], v[d], side="left")
                at_most = np.searchsorted(x[:, d], v[d], side="right")
                errs.append(max(0.0, below - 1 - h, h - at_most) / n)
            out[(name, key)] = max(errs)
    return out


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """Every command that writes stats.json, run once on the LeRobot-written fixtures."""
    tmp = tmp_path_factory.mktemp("q")
    out: dict[str, Path] = {}
    for name in ("rec40", "edited35", "vid24"):
        shutil.copytree(FIXTURES / name, tmp / name)
        out[f"lerobot-{name}"] = tmp / name  # untouched: for the validate check only
    ours = tmp / "stats-rec40"
    shutil.copytree(FIXTURES / "rec40", ours)
    cli("metadata", "stats", str(ours))
    out["metadata-stats"] = ours
    cli("prepare", str(tmp / "edited35"), "--out", str(tmp / "prep"), "--stats", "recompute")
    out["prepare-recompute"] = tmp / "prep"
    cli("edit", str(tmp / "rec40"), "--drop-episodes", "3,7,12", "--out", str(tmp / "edit"))
    out["edit"] = tmp / "edit"
    cli("edit", str(ours), "--drop-episodes", "0,5", "--out", str(tmp / "edit-sketched"))
    out["edit-from-sketches"] = tmp / "edit-sketched"
    cut = ("--drop-frames", "3:11-20,9:40-46,30:0-99")
    cli("edit", str(tmp / "rec40"), *cut, "--out", str(tmp / "edit-cut"))
    out["edit-frames"] = tmp / "edit-cut"
    cli("edit", str(ours), *cut, "--out", str(tmp / "edit-cut-sketched"))
    out["edit-frames-from-sketches"] = tmp / "edit-cut-sketched"
    cli("split", str(tmp / "edited35"), "--out", str(tmp / "split"), "--fractions", "a=0.6,b=0.4")
    out["split-a"], out["split-b"] = tmp / "split/a", tmp / "split/b"
    cli("merge", str(ours), str(tmp / "edited35"), "--out", str(tmp / "merged"))
    out["merge"] = tmp / "merged"
    cli("repair", str(FIXTURES / "crash_rec7"), "--out", str(tmp / "repaired"))
    out["repair"] = tmp / "repaired"
    cli("convert", str(FIXTURES / "v21vid8"), "--out", str(tmp / "conv"), "--stats", "complete")
    out["convert-complete"] = tmp / "conv"
    return out


WRITTEN = [
    "metadata-stats",
    "prepare-recompute",
    "edit",
    "edit-from-sketches",
    "edit-frames",
    "edit-frames-from-sketches",
    "split-a",
    "split-b",
    "merge",
    "repair",
    "convert-complete",
]


SIDECAR = {
    "metadata-stats",
    "prepare-recompute",
    "edit-from-sketches",
    "edit-frames-from-sketches",
    "convert-complete",
}


@pytest.mark.parametrize("what", WRITTEN)
def test_every_written_quantile_is_within_the_bound(outputs, what):
    errors = exact_rank_errors(outputs[what])
    assert errors, "no quantile keys"
    bad = {k: round(v, 4) for k, v in errors.items() if v > BOUND}
    assert not bad, bad
    # a source with sketches gives its output a sidecar (the next edit reads the sketches); one
    # without (LeRobot-written) gives exact quantiles, counted while writing, and none
    assert (outputs[what] / SKETCHES_FILE).is_file() == (what in SIDECAR), what


def test_lerobot_quantiles_are_what_the_bound_is_about(outputs):
    """The fixtures' own stats.json (LeRobot's mean of episode quantiles) fails the bound: the
    test above can fail."""
    errors = exact_rank_errors(outputs["lerobot-rec40"])
    assert errors[("action", "q99")] > 0.1


def _deep(root: Path) -> tuple[int, list[dict]]:
    p = subprocess.run(
        [*CLI, "validate", str(root), "--deep", "--checks", "stats", "--json"],
        capture_output=True,
        text=True,
    )
    return p.returncode, json.loads(p.stdout)["findings"]


def test_validate_deep_warns_on_lerobot_quantiles(outputs):
    code, findings = _deep(outputs["lerobot-rec40"])
    assert code == 0
    ranks = [f for f in findings if f["check"] == "stats.quantile_rank"]
    assert ranks and all(f["severity"] == "warning" for f in ranks)
    action = next(f for f in ranks if f.get("feature") == "action")
    assert "rank" in action["message"] and action["value"] > 0.1


@pytest.mark.parametrize(
    "what", ["edit", "edit-from-sketches", "edit-frames", "merge", "split-a", "repair"]
)
def test_validate_deep_finds_nothing_on_our_outputs(outputs, what):
    code, findings = _deep(outputs[what])
    assert code == 0
    assert [f for f in findings if f["check"] in ("stats.quantile_rank", "stats.recompute")] == []


def test_edit_with_sketches_reads_no_column_again(outputs, tmp_path, monkeypatch):
    """With fresh sketches in the source, edit reads no data column for its stats: the kept
    episodes' sketches are the source's, the renumbered columns' are made while written."""
    from episodekit.writers import stats_quantiles
    from episodekit.writers.edit import EditSpec, edit

    computed: list[list[str]] = []
    real = stats_quantiles.compute_stats
    monkeypatch.setattr(
        stats_quantiles,
        "compute_stats",
        lambda ds, **kw: computed.append(sorted(kw["features"])) or real(ds, **kw),
    )
    src = outputs["metadata-stats"]
    assert read_episode_sketches(open_dataset(str(src))) is not None
    edit(str(src), tmp_path / "out", EditSpec(drop_episodes=(1, 2)))
    assert computed == []  # the renumbered columns too were reduced while written
    errors = exact_rank_errors(tmp_path / "out")
    assert max(errors.values()) <= BOUND


def test_prepare_says_how_far_kept_quantiles_are(outputs, tmp_path):
    """prepare keeps LeRobot's stats (they pass the checks) and says where their q99 really is;
    with exact stats of ours (no note) it says nothing of the kind."""
    p = cli("prepare", str(outputs["lerobot-rec40"]), "--out", str(tmp_path / "p"))
    line = next(x for x in p.stdout.splitlines() if x.strip().startswith("stats"))
    assert "kept; q99 is the data's 8" in line and "`--stats recompute` writes exact ones" in line
    assert json.loads((tmp_path / "p/meta/stats.json").read_text()) == json.loads(
        (FIXTURES / "rec40/meta/stats.json").read_text()
    )  # kept byte for byte: saying it changes nothing
