"""episodekit validate: every check fires on its corruption, with the right file and episode,
and stays silent on a clean sample; exit codes, JSON schema, annotations, read-only."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from episodekit.cli import main
from episodekit.validate.runner import (
    CHECKS,
    CannotValidate,
    Finding,
    Report,
    format_annotations,
    format_report,
    select_checks,
    validate,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # corruptions.py
from corruptions import CORRUPTIONS, SAMPLE_SPEC, write_artifacts  # noqa: E402

NO_LAYOUT = "all,-layout"


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def clean(make_sample) -> Path:
    return make_sample(**SAMPLE_SPEC)


def test_corpus_is_large_enough():
    assert len(CORRUPTIONS) >= 15


# The sample writer writes stats as LeRobot's recorder does (dataset quantiles: the mean of the
# episodes'), which stats.quantile_rank rightly reports (warnings): tests/metadata/...ranks.
LEROBOT_QUANTILES = "stats.quantile_rank"


def test_clean_sample_has_no_findings_outside_layout(clean):
    report = validate(clean, checks=f"{NO_LAYOUT},-{LEROBOT_QUANTILES}", deep=True)
    assert report.findings == []
    assert report.exit_code() == 0
    assert "data.rows" in report.checks_run and "layout.page_index" not in report.checks_run
    write_artifacts(clean)
    assert (clean / "meta/shard_plans/ws2_nw2.json").exists()
    assert validate(clean, checks=NO_LAYOUT).findings == []


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corruption_is_caught(clean, name):
    expected = CORRUPTIONS[name](clean)
    report = validate(clean, checks=NO_LAYOUT)
    hits = [f for f in report.findings if f.check == expected.check]
    assert hits, f"{name}: no {expected.check} finding in {report.findings}"
    assert any(f.file == expected.file and f.episode == expected.episode for f in hits), (
        f"{name}: {expected} not among {hits}"
    )
    allowed = {expected.check, *expected.also}
    stray = [f for f in report.errors if f.check not in allowed]
    assert not stray, f"{name}: unexpected findings {stray}"
    assert report.exit_code() == 1


def test_validation_never_modifies_the_root(clean):
    CORRUPTIONS["row_deleted"](clean)
    before = tree_hash(clean)
    validate(clean, deep=True)
    assert tree_hash(clean) == before


def test_layout_warnings_on_recorded_and_edited_samples(make_sample):
    recorded = validate(make_sample(episodes=6, seed=2, copy=False), checks="layout")
    assert {f.check for f in recorded.findings} == {"layout.row_groups", "layout.page_index"}
    assert all(f.severity == "warning" for f in recorded.findings)
    assert recorded.exit_code() == 0 and recorded.exit_code(strict=True) == 1
    edited = validate(make_sample(episodes=6, seed=2, style="edited", copy=False), checks="layout")
    assert {f.check for f in edited.findings} == {"layout.page_index"}  # one group, under target


def test_layout_flags_split_episodes(clean):
    rel = "data/chunk-000/file-000.parquet"
    table = pq.read_table(clean / rel)
    pq.write_table(table, clean / rel, row_group_size=100, write_page_index=True)
    report = validate(clean, checks="layout")
    split = [f for f in report.findings if f.check == "layout.split_episode"]
    assert split and split[0].file == rel and split[0].episode == 0
    assert not [f for f in report.findings if f.check == "layout.page_index" and f.file == rel]


def test_deep_checks_image_headers(make_sample):
    root = make_sample(episodes=4, seed=4, images=True)
    assert validate(root, checks="data", deep=True).findings == []
    rel = "data/chunk-000/file-000.parquet"
    table = pq.read_table(root / rel)
    col = table["observation.images.wrist"].to_pylist()
    col[3] = {"bytes": b"not an image", "path": None}
    i = table.schema.get_field_index("observation.images.wrist")
    table = table.set_column(i, table.schema.field(i), pa.array(col, table.schema.field(i).type))
    pq.write_table(table, root / rel)
    shallow = validate(root, checks="data")
    assert shallow.findings == []
    deep = validate(root, checks="data", deep=True)
    assert [(f.check, f.file, f.episode) for f in deep.findings] == [("data.image", rel, 0)]


def test_undeclared_column_is_a_warning(make_sample):
    root = make_sample(episodes=4, seed=5, extra_column=True)
    report = validate(root, checks=NO_LAYOUT)
    assert [(f.check, f.severity) for f in report.findings] == [("info.features", "warning")]
    assert "language_events" in report.findings[0].message


def test_v21_sample_is_clean(make_sample):
    root = make_sample(episodes=5, seed=6, version="v2.1")
    assert validate(root, checks=NO_LAYOUT).findings == []


def test_missing_info_cannot_run(clean, tmp_path):
    (clean / "meta/info.json").unlink()
    with pytest.raises(CannotValidate):
        validate(clean)
    with pytest.raises(CannotValidate):
        validate(tmp_path / "nope")
    (tmp_path / "bad" / "meta").mkdir(parents=True)
    (tmp_path / "bad" / "meta" / "info.json").write_text("{not json")
    with pytest.raises(CannotValidate):
        validate(tmp_path / "bad")


def test_select_checks():
    assert select_checks("data.rows") == ["data.rows"]
    assert "data.image" not in select_checks("data")
    assert "data.image" in select_checks("data", deep=True)
    assert not [c for c in select_checks("all,-layout") if c.startswith("layout")]
    assert set(select_checks("artifacts")) == {
        c for c in CHECKS if c.split(".")[0] in ("speed", "costs", "plans")
    }
    with pytest.raises(ValueError, match="unknown check"):
        select_checks("nope")


def test_cli_exit_codes_and_json(clean):
    runner = CliRunner()
    ok = runner.invoke(main, ["validate", str(clean), "--checks", NO_LAYOUT, "--json"])
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.stdout)
    assert set(data) == {
        "version",
        "root",
        "fingerprint",
        "ok",
        "exit_code",
        "strict",
        "seconds",
        "counts",
        "checks_run",
        "findings",
    }
    assert data["ok"] and data["findings"] == [] and data["counts"] == {"error": 0, "warning": 0}
    warn = runner.invoke(main, ["validate", str(clean)])
    assert warn.exit_code == 0 and "layout.page_index" in warn.stdout
    strict = runner.invoke(main, ["validate", str(clean), "--strict"])
    assert strict.exit_code == 1
    CORRUPTIONS["timestamp"](clean)
    bad = runner.invoke(main, ["validate", str(clean), "--checks", "data", "--json"])
    assert bad.exit_code == 1
    finding = json.loads(bad.stdout)["findings"][0]
    assert set(finding) == {"check", "severity", "message", "file", "episode"}
    assert finding["check"] == "data.timestamp" and finding["episode"] == 8
    assert runner.invoke(main, ["validate", str(clean), "--checks", "nope"]).exit_code == 2
    assert runner.invoke(main, ["validate", str(clean / "missing")]).exit_code == 2


def test_human_report_groups_by_check(clean):
    CORRUPTIONS["nan_in_action"](clean)
    text = format_report(validate(clean, checks=NO_LAYOUT))
    assert "data.nan" in text and "episode 10" in text and text.rstrip().endswith("0 warnings")
    assert "FAILED: 1 error," in text


def test_github_annotations(clean, monkeypatch):
    report = Report(
        root="/r",
        findings=[
            Finding("data.rows", "error", "3 rows, 50% missing\nsecond", "data/f,1.parquet", 4),
            Finding("layout.page_index", "warning", "no page index", "data/x.parquet"),
        ],
    )
    lines = format_annotations(report).splitlines()
    assert lines == [
        "::error file=/r/data/f%2C1.parquet,title=data.rows::episode 4: 3 rows, 50%25 missing%0A"
        "second",
        "::warning file=/r/data/x.parquet,title=layout.page_index::no page index",
    ]
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    out = CliRunner().invoke(main, ["validate", str(clean)])
    assert "::warning file=" in out.stdout and "title=layout.page_index" in out.stdout


def test_prepared_sample_is_clean_even_strict(clean):
    from episodekit.prep import rewrite_rowgroups

    rewrite_rowgroups(str(clean), target_mb=0.2, workers=1)
    report = validate(clean, checks=f"all,-{LEROBOT_QUANTILES}", strict=True, deep=True)
    assert report.findings == [] and report.exit_code() == 0


def test_per_file_scan_equals_one_query(clean):
    """The per-file scan (the unit of work on ray) gives exactly the one-query result."""
    import polars as pl

    from episodekit.core.executor import map_files
    from episodekit.validate.data import _scan_job, scan_data_files, scan_root
    from episodekit.validate.raw import read_raw

    CORRUPTIONS["nan_in_action"](clean)
    raw = read_raw(str(clean))
    files = [str(clean / r) for r in raw.data_files()]
    feats = list(raw.features)
    whole = scan_data_files(files, raw.fps, feats)
    jobs = [(f, raw.fps, feats, None, False) for f in files]
    per_file = pl.concat(map_files(_scan_job, jobs, executor="local", workers=1))
    assert whole.height == 30 and whole.equals(per_file)
    assert int(whole["nonfinite:action"].sum()) == 1
    rooted = scan_root(raw, {r: pq.read_schema(clean / r) for r in raw.data_files()})
    assert rooted["file"].to_list() == [raw.rel(f) for f in whole["file"].to_list()]


def test_missing_video_file_is_info_videos_and_can_be_excluded(make_sample):
    from episodekit.validate.runner import validate as run_validate

    root = make_sample(episodes=12, videos=1)
    mp4 = sorted((root / "videos").rglob("*.mp4"))[0]
    mp4.unlink()
    rel = str(mp4.relative_to(root))
    report = run_validate(str(root), checks="info")
    hits = [f for f in report.findings if f.check == "info.videos"]
    assert hits and hits[0].file == rel and hits[0].episode == 0
    assert report.exit_code() == 1
    assert not [
        f
        for f in run_validate(str(root), checks="info,-info.videos").findings
        if f.check == "info.videos"
    ]
