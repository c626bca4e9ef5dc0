"""``--metadata-only`` and ``--sample-episodes`` in the CI formats: one run on a corrupted copy
of LeRobot's rec40 says in every format what it did not read (text, JSON, a GitHub notice and
the step summary, SARIF run properties and notifications under a category of its own, JUnit
``<skipped>`` test cases, Markdown, HTML), each checked by its consumer; a baseline is not told
"gone" by a check run in part; the registry says what each check reads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import junitparser
import pytest
import xmlschema

from episodekit.validate import checks as registry
from episodekit.validate.passes import DATA_SCAN
from episodekit.validate.scope import PARTIAL, SAMPLED, Scope, skipped_checks

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # corruptions.py
from corruptions import corrupt_for_ci  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS / "fixtures" / "lerobot"
SCHEMAS = TESTS / "fixtures" / "schemas"
CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]
IGNORE = ("--ignore", "layout")


def run(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    r = subprocess.run(
        [*CLI, "validate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def corrupted(tmp_path_factory):
    """rec40 with info.totals (metadata), data.nan in episode 10, quality.frozen and
    quality.jump (data pages); one --metadata-only run writing every format."""
    work = tmp_path_factory.mktemp("scope")
    root = work / "rec40"
    shutil.copytree(FIXTURES / "rec40", root)
    corrupt_for_ci(root)
    out = work / "out"
    out.mkdir()
    summary = out / "summary.md"
    summary.write_text("")
    args = [root, "--metadata-only", "--format", "github", *IGNORE]
    for fmt in ("json", "sarif", "junit", "markdown", "html", "text"):
        args += ["--report", f"{fmt}:{out / ('r.' + fmt)}"]
    r = run(*args, env={"GITHUB_STEP_SUMMARY": str(summary)})
    return root, out, r


def test_metadata_only_in_every_format(corrupted):
    root, out, r = corrupted
    assert r.returncode == 1, r.stderr  # info.totals: a metadata finding
    doc = json.loads((out / "r.json").read_text())
    assert {f["check"] for f in doc["findings"]} == {"info.totals"}  # no data page read
    skipped = doc["checks_skipped"]
    assert skipped["data.nan"] == "(reads data pages)" and "quality.frozen" in skipped
    assert doc["scope"] == {"mode": "metadata-only", "seed": None, "sample_episodes": None}

    # GitHub: the error annotation, then one notice naming the checks not run
    notices = [ln for ln in r.stdout.splitlines() if ln.startswith("::notice ")]
    assert len(notices) == 1 and notices[0].startswith(
        f"::notice title=episodekit metadata-only::metadata-only run: {len(skipped)} checks "
        "not run, 2 run in part: data.file, "
    )
    assert "data.nan" in notices[0]
    for text in ((out / "summary.md").read_text(), (out / "r.markdown").read_text()):
        assert "Scope: **metadata-only**." in text
        assert "- not run (reads data pages): data.file, data.rows," in text

    # SARIF: valid; the scope in the run's properties and notifications, a category of its own
    sarif = json.loads((out / "r.sarif").read_text())
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    validator = jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())
    assert [e.message for e in validator.iter_errors(sarif)] == []
    run_ = sarif["runs"][0]
    assert run_["automationDetails"]["id"] == "episodekit-validate-metadata-only/"
    props = run_["properties"]
    assert props["scope"]["mode"] == "metadata-only" and props["checksSkipped"] == skipped
    assert props["checksPartial"]["data.read"] == "the parquet footers only"
    notes = run_["invocations"][0]["toolExecutionNotifications"]
    assert {n["level"] for n in notes} == {"note"}
    assert any(n["message"]["text"].startswith("not run (reads data pages): ") for n in notes)
    rules = {rule["id"] for rule in run_["tool"]["driver"]["rules"]}
    assert "data.nan" not in rules and "info.totals" in rules

    # JUnit: valid; a skipped test case per check not run, with the reason
    xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd")).validate(str(out / "r.junit"))
    suite = next(iter(junitparser.JUnitXml.fromfile(str(out / "r.junit"))))
    cases = {c.name: c for c in suite}
    assert {n for n, c in cases.items() if c.is_skipped} == set(skipped)
    (why,) = cases["data.nan"].result
    assert isinstance(why, junitparser.Skipped)
    assert why.message == "metadata-only run: not run (reads data pages)"
    assert {n for n, c in cases.items() if not c.is_passed and not c.is_skipped} == {"info.totals"}
    assert suite.skipped == len(skipped) and suite.tests == len(cases)
    assert "run on the parquet footers only" in cases["data.read"].system_out

    # HTML and text: the scope said; no plot that reads data pages
    page = (out / "r.html").read_text()
    assert "Scope: <b>metadata-only</b>" in page and "not run (reads data pages)" in page
    assert "Feature distributions" not in page and "Flagged episodes</h2>" not in page
    text = (out / "r.text").read_text()
    assert text.splitlines()[0].endswith(", metadata-only)")
    assert "run on the parquet footers only: data.read" in text


def test_a_full_run_has_no_scope_in_any_format(corrupted, tmp_path):
    root, _, _ = corrupted
    sarif = json.loads(run(root, "--format", "sarif", *IGNORE).stdout)["runs"][0]
    assert sarif["automationDetails"]["id"] == "episodekit-validate/"
    assert "scope" not in sarif["properties"] and "invocations" in sarif
    assert "toolExecutionNotifications" not in sarif["invocations"][0]
    junit = tmp_path / "j.xml"
    junit.write_text(run(root, "--format", "junit", *IGNORE).stdout)
    suite = next(iter(junitparser.JUnitXml.fromfile(str(junit))))
    assert suite.skipped == 0 and not any(c.is_skipped for c in suite)
    github = run(root, "--format", "github", *IGNORE).stdout
    assert "::notice" not in github and "not run" not in github


def test_sampled_run_in_junit_and_github(corrupted, tmp_path):
    root, _, _ = corrupted
    junit = tmp_path / "j.xml"
    r = run(root, "--sample-episodes", "4", "--format", "github", *IGNORE,
            "--report", f"junit:{junit}")  # fmt: skip
    assert "episodes sampled (seed 0)" in r.stdout
    suite = next(iter(junitparser.JUnitXml.fromfile(str(junit))))
    cases = {c.name: c for c in suite}
    assert not cases["data.nan"].is_skipped and cases["quality.frozen"].is_skipped
    assert "the 4 sampled episodes only" in cases["data.nan"].system_out
    props = {p.name: p.value for p in suite.properties()}
    assert props["scope"] == "sample" and len(props["sample_episodes"].split(",")) == 4


def test_a_check_run_in_part_does_not_call_baseline_entries_gone(corrupted, tmp_path):
    """A baseline of the full run (data.nan in episode 10) against a sample without episode 10
    and a metadata-only run: nothing is gone (data.nan judged the sample only, data.read the
    footers only); the checks not run say nothing either."""
    root, _, _ = corrupted
    base = tmp_path / "baseline.json"
    assert run(root, "--write-baseline", base, *IGNORE).returncode == 0
    entries = json.loads(base.read_text())["findings"]
    assert ("data.nan", 10) in {(e["check"], e["episode"]) for e in entries}
    doc = json.loads(run(root, "--sample-episodes", "2", "--baseline", base, "--json",
                         *IGNORE).stdout)  # fmt: skip
    assert doc["scope"]["sample_episodes"] == [0, 39] and "data.nan" in doc["checks_run"]
    assert doc["baseline"]["gone"] == [] and doc["exit_code"] == 0
    doc = json.loads(run(root, "--metadata-only", "--baseline", base, "--json", *IGNORE).stdout)
    assert doc["baseline"]["gone"] == [] and doc["exit_code"] == 0


def test_the_registry_says_what_each_check_reads():
    """What --metadata-only runs comes from the registry's Check.reads: the quality checks the
    tables decide run, the per-episode data checks are the sample's, the data scan's."""
    kinds = {registry.METADATA, registry.EPISODE_PAGES, registry.DATA_PAGES,
             registry.DATASET_PAGES, registry.STATS_PAGES, registry.FRAMES}  # fmt: skip
    assert {c.reads for c in registry.REGISTRY} == kinds
    meta_quality = {c.id for c in registry.REGISTRY
                    if c.group == "quality" and c.reads == registry.METADATA}  # fmt: skip
    assert meta_quality == {
        "quality.single_frame",
        "quality.short_episode",
        "quality.length_outlier",
        "quality.task_placeholder",
        "quality.task_rare",
    }
    assert set(SAMPLED) <= set(DATA_SCAN) and set(DATA_SCAN) - set(SAMPLED) == set(PARTIAL)
    every = registry.ids()
    skipped = skipped_checks(Scope(metadata_only=True), every)
    assert set(skipped) == {c.id for c in registry.REGISTRY if c.reads != registry.METADATA}
    assert skipped["video.decode"] == "(decodes every video frame)"
    assert skipped["stats.recompute"] == "(recomputes the stats from every data page)"
    sampled = skipped_checks(Scope(sample=3), every)
    assert not set(sampled) & set(SAMPLED)
    assert sampled["data.language"] == "(reads every data file, not a sample's row groups)"
