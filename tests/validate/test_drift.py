"""``quality.drift``: a step along the episode order (channels swapped, a sensor recalibrated) is
reported with its dimension and the episode it starts at; natural variation is not: tasks in
blocks, trends, heavy tails, LeRobot's own datasets, our samples of several styles and seeds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from episodekit.validate.drift import DEFAULTS, _dimension
from episodekit.validate.runner import validate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # corruptions.py
from corruptions import QUALITY_CORRUPTIONS, QUALITY_SPEC  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CLI = [sys.executable, "-m", "episodekit.cli"]


def changes(mean, std=None, tasks=None, **th) -> list[tuple[str, int]]:
    """(statistic, first episode) of every drift the check reports on one dimension."""
    n = len(mean)
    std = np.ones(n) if std is None else std
    tasks = np.zeros(n, np.int64) if tasks is None else tasks
    got = _dimension(
        np.arange(n), tasks, np.asarray(mean, float), np.asarray(std, float), "x", 0,
        {**DEFAULTS, **th}, lambda f, j: f"{f}[{j}]", {},
    )  # fmt: skip
    return [(c["details"]["statistic"], c["episode"]) for c in got]


@pytest.mark.parametrize("n", [20, 40, 100, 400, 3000])
def test_natural_variation_is_not_drift(n):
    rng = np.random.default_rng(n)
    spread = np.exp(0.3 * rng.standard_normal(n))
    for _ in range(20):
        for noise in (rng.standard_normal(n), rng.standard_t(2, n), rng.standard_cauchy(n)):
            assert changes(noise, spread) == []
        blocks = np.repeat(np.arange(5), -(-n // 5))[:n]  # five tasks recorded one after another
        level = rng.normal(0, 10, 5)[blocks] + rng.standard_normal(n)
        assert changes(level, spread * np.exp(rng.normal(0, 1, 5))[blocks], blocks) == []
        for total in (3, 20, 100):  # a steady trend, however large, is not a step
            assert changes(np.linspace(0, total, n) + rng.standard_normal(n), spread) == []
            assert changes(rng.standard_normal(n), np.exp(np.linspace(0, np.log(total), n))) == []
        if n >= 400:  # a slow ramp (over 100+ episodes, 5x the window) is no step
            ramp = np.clip((np.arange(n) - n / 4) / (n / 4), 0, 1) * 10
            assert changes(ramp + rng.standard_normal(n), spread) == []
        assert changes(np.round(rng.standard_normal(n)), spread) == []  # few distinct values
        assert changes(np.where(rng.random(n) < 0.7, 0, rng.random(n)), spread) == []
        assert changes(np.zeros(n), np.zeros(n)) == []


@pytest.mark.parametrize("n, at", [(24, 12), (100, 15), (100, 85), (3000, 450), (3000, 2550)])
def test_a_step_is_found_at_its_episode(n, at):
    rng = np.random.default_rng(at)
    level = rng.standard_normal(n)
    level[at:] += 8
    assert changes(level, np.exp(0.3 * rng.standard_normal(n))) == [("level", at)]
    spread = np.exp(0.1 * rng.standard_normal(n))
    spread[at:] *= 4
    assert changes(rng.standard_normal(n), spread) == [("spread", at)]


def test_short_segments_and_small_steps_are_left_alone():
    rng = np.random.default_rng(0)
    level = rng.standard_normal(40)
    level[36:] += 20  # four episodes: too few to tell from outliers
    assert changes(level) == []
    level = rng.standard_normal(200)
    level[100:] += 3  # three spreads of the episodes: within natural variation
    assert changes(level) == []
    assert changes(level, drift_sigmas=2.0) == [("level", 100)]  # unless asked


@pytest.mark.parametrize("name", ["rec40", "edited35", "vid24"])
def test_lerobot_datasets_have_no_drift(name, tmp_path):
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    r = subprocess.run(
        [*CLI, "validate", str(root), "--checks", "quality", "--json", "--fail-on", "warning"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout
    assert json.loads(r.stdout)["findings"] == []


@pytest.mark.parametrize(
    "spec",
    [
        {"episodes": 200, "tasks": 8, "seed": 6, "mean_length": 40, "style": "edited"},
        {"episodes": 60, "tasks": 4, "seed": 6},
        {"episodes": 30, "tasks": 2, "seed": 5, "mean_length": 80, "version": "v2.1"},
        {"episodes": 600, "tasks": 6, "seed": 11, "mean_length": 20},
    ],
    ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()),
)
def test_samples_have_no_drift(make_sample, spec):
    """The specs where the statistic came closest to a finding over 27 samples (2.9 robust
    deviations at most, threshold 5), plus a long one."""
    assert validate(make_sample(copy=False, **spec), checks="quality.drift").findings == []


def test_cli_names_dimension_and_episode_and_a_thresholds_file_silences_it(make_sample, tmp_path):
    root = make_sample(**QUALITY_SPEC)
    expected = QUALITY_CORRUPTIONS["channels_swapped"](root)
    r = subprocess.run(
        [*CLI, "validate", str(root), "--checks", "quality.drift", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr  # a warning
    found = json.loads(r.stdout)["findings"]
    assert {(f["feature"], f["dimension"], f["episode"]) for f in found} >= {
        ("observation.state", 0, 50),
        ("observation.state", 13, 50),
    }
    assert all(f["file"] == expected.file and "at episode 50" in f["message"] for f in found)
    assert all(0 < len(f["details"]["signal"]) <= 48 for f in found)
    th = tmp_path / "th.json"
    th.write_text(json.dumps({"drift_sigmas": 100}))
    args = [*CLI, "validate", str(root), "--checks", "quality.drift", "--fail-on", "warning"]
    assert subprocess.run(args, capture_output=True, timeout=300).returncode == 1
    quiet = subprocess.run([*args, "--quality-thresholds", str(th)], capture_output=True)
    assert quiet.returncode == 0, quiet.stdout


def test_a_drift_flags_no_episode_for_exclusion():
    from episodekit.validate.flagged import episodes_of_findings

    findings = [
        {"check": "quality.drift", "episode": 50},
        {"check": "quality.frozen", "episode": 5},
    ]
    assert episodes_of_findings(findings, ["quality.drift", "quality.frozen"]) == {
        5: ["quality.frozen"]
    }
