"""quality.* data-quality checks: every check fires on its corruption (right episode, file and
feature) and stays silent on the clean twin; clean samples of every style give no finding;
thresholds file override, --min-length, --fail-on warning, the Markdown report, and --json on
unreadable input (run as a user runs the CLI: subprocess)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from episodekit.cli import main
from episodekit.validate.quality import (
    CHECKS as QUALITY_CHECKS,
)
from episodekit.validate.quality import (
    DEFAULTS,
    ThresholdsError,
    load_thresholds,
)
from episodekit.validate.raw import Finding
from episodekit.validate.report import format_markdown, sparkline, write_markdown
from episodekit.validate.runner import CHECKS, validate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # corruptions.py
from corruptions import QUALITY_CORRUPTIONS, QUALITY_SPEC  # noqa: E402

NO_LAYOUT = "all,-layout,-stats"  # corruptions change lengths: stats.* fire too (tested there)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from episodekit.cli import main; main()", "validate", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def invoke(*args: str):
    """In-process CLI run, for output content (exit codes go through :func:`cli`)."""
    return CliRunner().invoke(main, ["validate", *args])


@pytest.fixture
def qclean(make_sample) -> Path:
    return make_sample(**QUALITY_SPEC)


def test_every_quality_check_has_a_corruption_or_a_dedicated_test():
    covered = {fn.__name__ for fn in QUALITY_CORRUPTIONS.values()}
    assert len(covered) >= 15
    assert set(QUALITY_CHECKS) <= set(CHECKS)
    assert all(c.startswith("quality.") for c in QUALITY_CHECKS)


@pytest.mark.parametrize(
    "spec",
    [
        {"episodes": 40, "tasks": 6, "seed": 1},
        {"episodes": 30, "tasks": 3, "seed": 3, "data_files_size_in_mb": 0.5},
        {"episodes": 60, "tasks": 4, "seed": 2, "style": "edited", "mean_length": 80},
        {"episodes": 50, "tasks": 4, "seed": 6, "version": "v2.1", "mean_length": 60},
        {
            "episodes": 120,
            "tasks": 8,
            "seed": 8,
            "mean_length": 40,
            "fps": 15,
            "state_dim": 6,
            "action_dim": 6,
        },
        {"episodes": 3, "tasks": 2, "seed": 4},
    ],
    ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()),
)
def test_clean_samples_have_no_quality_findings(make_sample, spec):
    root = make_sample(copy=False, **spec)
    report = validate(root, checks="quality")
    assert report.findings == []
    assert set(QUALITY_CHECKS) <= set(report.checks_run)


@pytest.mark.parametrize("name", sorted(QUALITY_CORRUPTIONS))
def test_quality_corruption_is_caught_and_clean_twin_is_silent(make_sample, name):
    clean = make_sample(copy=False, **QUALITY_SPEC)
    expected_check = None
    root = make_sample(**QUALITY_SPEC)
    expected = QUALITY_CORRUPTIONS[name](root)
    expected_check = expected.check
    report = validate(root, checks=NO_LAYOUT)
    hits = [f for f in report.findings if f.check == expected.check]
    assert hits, f"{name}: no {expected.check} in {report.findings}"
    match = [
        f
        for f in hits
        if f.file == expected.file
        and f.episode == expected.episode
        and (expected.feature is None or f.feature == expected.feature)
    ]
    assert match, f"{name}: {expected} not among {hits}"
    f = match[0]
    assert f.severity == "warning" and f.value is not None
    assert set(f.to_dict()) >= {"check", "severity", "message", "file", "episode", "value"}
    allowed = {expected.check, *expected.also}
    stray = [f for f in report.findings if f.check not in allowed]
    assert not stray, f"{name}: unexpected findings {stray}"
    # Warnings pass by default, fail when asked.
    assert report.exit_code() == (1 if report.errors else 0)
    assert report.exit_code(strict=True) == 1
    # The clean twin: the same check on the untouched sample says nothing.
    assert validate(clean, checks=expected_check).findings == []


def test_jump_finding_names_dimension_frame_and_signal(make_sample):
    root = make_sample(**QUALITY_SPEC)
    QUALITY_CORRUPTIONS["spike"](root)
    (f,) = [f for f in validate(root, checks="quality.jump").findings]
    assert (f.episode, f.feature, f.dimension, f.value) == (
        9,
        "action",
        3,
        pytest.approx(1000, 0.01),
    )
    assert f.details["frame"] == 10 and len(f.details["signal"]) <= 48
    assert max(f.details["signal"]) == pytest.approx(1000.0)
    d = f.to_dict()
    assert d["dimension"] == 3 and d["details"]["frame"] == 10
    json.dumps(d)


def test_min_length_fires_only_when_set(make_sample):
    root = make_sample(copy=False, **QUALITY_SPEC)
    assert validate(root, checks="quality.short_episode").findings == []
    lengths = sorted(
        int(x)
        for x in __import__("pyarrow.parquet")
        .parquet.read_table(root / "meta/episodes/chunk-000/file-000.parquet", columns=["length"])[
            "length"
        ]
        .to_pylist()
    )
    n = lengths[3] + 1  # the four shortest episodes are shorter
    report = validate(root, checks="quality.short_episode", quality_thresholds={"min_length": n})
    assert len(report.findings) == 4
    assert all(f.value < n and f.episode is not None for f in report.findings)


def test_findings_without_quality_fields_keep_the_old_json():
    f = Finding("data.rows", "error", "x", "data/a.parquet", 3)
    assert f.to_dict() == {
        "check": "data.rows",
        "severity": "error",
        "message": "x",
        "file": "data/a.parquet",
        "episode": 3,
    }
    g = Finding("quality.jump", "warning", "m", None, 1, "action", 2, float("inf"), {"a": 1.5})
    assert g.to_dict()["value"] is None and g.to_dict()["details"] == {"a": 1.5}
    assert hash(g) == hash(
        Finding("quality.jump", "warning", "m", None, 1, "action", 2, float("inf"))
    )


def test_load_thresholds_json_toml_and_errors(tmp_path):
    j = tmp_path / "t.json"
    j.write_text(json.dumps({"jump_sigmas": 30, "frozen_share": 0.9}))
    th = load_thresholds(j)
    assert th["jump_sigmas"] == 30 and th["frozen_share"] == 0.9
    assert th["range_sigmas"] == DEFAULTS["range_sigmas"]
    t = tmp_path / "t.toml"
    t.write_text("[quality]\nclip_share = 0.3\n")
    assert load_thresholds(t, min_length=12)["clip_share"] == 0.3
    assert load_thresholds(t, min_length=12)["min_length"] == 12
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"jump_sigma": 3}))
    with pytest.raises(ThresholdsError, match="unknown quality threshold 'jump_sigma'"):
        load_thresholds(bad)
    bad.write_text(json.dumps({"jump_sigmas": "high"}))
    with pytest.raises(ThresholdsError, match="number"):
        load_thresholds(bad)
    bad.write_text("{not json")
    with pytest.raises(ThresholdsError, match="cannot read"):
        load_thresholds(bad)


def test_cli_thresholds_file_overrides_and_fail_on_warning(make_sample, tmp_path):
    root = make_sample(**QUALITY_SPEC)
    QUALITY_CORRUPTIONS["frozen_action"](root)
    default = cli(str(root), "--checks", "quality", "--json")
    assert default.returncode == 0, default.stderr
    doc = json.loads(default.stdout)
    assert [f["check"] for f in doc["findings"]] == ["quality.frozen"]
    assert doc["findings"][0]["episode"] == 5 and doc["findings"][0]["feature"] == "action"
    failing = cli(str(root), "--checks", "quality", "--fail-on", "warning")
    assert failing.returncode == 1 and "quality.frozen" in failing.stdout
    loose = tmp_path / "loose.toml"
    loose.write_text("frozen_share = 1.01\n")
    relaxed = cli(
        str(root), "--checks", "quality", "--fail-on", "warning", "--quality-thresholds", str(loose)
    )
    assert relaxed.returncode == 0, relaxed.stdout
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"frozen": 1}')
    bad = invoke(str(root), "--quality-thresholds", str(unknown))
    assert bad.exit_code == 2 and "unknown quality threshold 'frozen'" in bad.output


def test_cli_fail_on_warning_passes_a_clean_root(make_sample):
    root = make_sample(copy=False, **QUALITY_SPEC)
    out = cli(str(root), "--checks", NO_LAYOUT, "--fail-on", "warning", "--min-length", "2")
    assert out.returncode == 0, out.stdout


def test_markdown_report_content(make_sample, tmp_path):
    root = make_sample(**QUALITY_SPEC)
    QUALITY_CORRUPTIONS["spike"](root)
    report_md = tmp_path / "out" / "report.md"
    report_md.parent.mkdir()
    out = invoke(str(root), "--checks", "quality", "--report", str(report_md))
    assert out.exit_code == 0, out.output
    text = report_md.read_text()
    assert text.startswith("# Validation report")
    assert "**OK**: 0 errors, 3 warnings" in text
    assert "| `quality.jump` | warning | 1 |" in text
    assert "## `quality.jump`" in text and "episode 9, action[3]" in text
    assert "at frame 10" in text
    assert "`▁█▁" in text  # the spike's sparkline
    # Clean root: a short "No findings." report.
    clean = make_sample(copy=False, **QUALITY_SPEC)
    assert (
        invoke(str(clean), "--checks", "quality", "--report", str(tmp_path / "c.md")).exit_code == 0
    )
    assert "No findings." in (tmp_path / "c.md").read_text()


def test_plots_written_or_skipped_cleanly(make_sample, tmp_path, monkeypatch):
    root = make_sample(**QUALITY_SPEC)
    QUALITY_CORRUPTIONS["frozen_action"](root)
    report = validate(root, checks="quality")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the extra were not installed
    note = write_markdown(report, CHECKS, tmp_path / "r.md", tmp_path / "plots")
    assert "matplotlib is not installed" in note and "episodekit[plots]" in note
    assert "quality.frozen" in (tmp_path / "r.md").read_text()
    monkeypatch.delitem(sys.modules, "matplotlib")
    pytest.importorskip("matplotlib")
    note = write_markdown(report, CHECKS, tmp_path / "r2.md", tmp_path / "plots2")
    assert note == ""
    pngs = list((tmp_path / "plots2").glob("*.png"))
    assert pngs and pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"[plot](plots2/{pngs[0].name})" in (tmp_path / "r2.md").read_text()


def test_sparkline():
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([1, 1]) == "▁▁" and sparkline([]) == ""
    assert sparkline([0, None, float("nan"), 7]) == "▁  █"


def test_format_markdown_escapes_pipes():
    class R:
        root, seconds, strict, checks_run = "r", 0.1, False, ["quality.frozen"]
        findings = [Finding("quality.frozen", "warning", "a|b", "f", 1, "action", None, 0.5)]
        errors: list = []
        warnings = findings

        def exit_code(self):
            return 0

    text = format_markdown(R(), CHECKS)
    assert "a\\|b" in text


def test_json_on_unreadable_data_file(make_sample):
    root = make_sample(**QUALITY_SPEC)
    path = sorted(root.glob("data/*/*.parquet"))[0]
    raw = bytearray(path.read_bytes())
    for i in range(100, len(raw) // 2, 7):  # pages garbled, footer intact
        raw[i] = (raw[i] * 31 + 7) % 256
    path.write_bytes(bytes(raw))
    out = cli(str(root), "--json")
    doc = json.loads(out.stdout)
    assert out.returncode == 1
    rel = str(path.relative_to(root))
    assert any(f["check"] == "data.read" and f["file"] == rel for f in doc["findings"])
    # The other data file is still checked (and clean).
    assert not [f for f in doc["findings"] if f["check"].startswith("quality.")]


def test_json_when_nothing_can_be_validated(tmp_path):
    out = cli(str(tmp_path / "missing"), "--json")
    assert out.returncode == 2
    doc = json.loads(out.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2 and "no such folder" in doc["error"]
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_truncated_data_file_does_not_break_quality(make_sample):
    root = make_sample(**QUALITY_SPEC)
    path = sorted(root.glob("data/*/*.parquet"))[-1]
    path.write_bytes(path.read_bytes()[:1000])
    report = validate(root, checks=NO_LAYOUT)
    assert any(f.check == "data.read" for f in report.findings)
    assert not [f for f in report.findings if f.check.startswith("quality.")]
    shutil.rmtree(root)


def test_plots_without_report_is_a_usage_error(make_sample, tmp_path):
    out = invoke(str(make_sample(episodes=4)), "--plots", str(tmp_path / "p"))
    assert out.exit_code == 2 and "--plots needs --report" in out.output
