"""validate's CI formats, each checked by its consumer: one run on a corrupted LeRobot-written
recording writes text, JSON, GitHub annotations (+ the step summary), SARIF (valid against the
official 2.1.0 schema), JUnit (read back by junitparser, valid against junit-10.xsd), Markdown
and HTML; clean LeRobot-written datasets give no finding in any format. Also: the registry
against the passes, the annotation budget, SARIF's limits, baselines, --select / --ignore and
episodekit.toml."""

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
from episodekit.validate.github import annotations
from episodekit.validate.junit import format_junit
from episodekit.validate.locate import key_lines
from episodekit.validate.passes import produced
from episodekit.validate.raw import Finding
from episodekit.validate.runner import Report, select_checks
from episodekit.validate.sarif import sarif_document

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # corruptions.py
from corruptions import CI_FINDINGS, corrupt_for_ci, edit_info  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS / "fixtures" / "lerobot"
SCHEMAS = TESTS / "fixtures" / "schemas"
CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]
DATA = "data/chunk-000/file-000.parquet"
INFO = "meta/info.json"
CLEAN = ("rec40", "edited35", "vid24", "lang5", "img6")
# Row groups and page index: what `prepare` fixes, reported on every LeRobot recording.
IGNORE = ("--ignore", "layout")


def run(*args, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    r = subprocess.run(
        [*CLI, "validate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    return r


def sarif_errors(doc: dict) -> list[str]:
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    v = jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())
    return [f"{list(e.absolute_path)}: {e.message}" for e in v.iter_errors(doc)]


def junit_valid(path: Path) -> None:
    xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd")).validate(str(path))


def every_format(root: Path, out: Path, *extra: str, env: dict | None = None):
    """One run: annotations on stdout, every other format as a --report."""
    out.mkdir(exist_ok=True)
    reports = [f"{f}:{out / ('r.' + f)}" for f in ("json", "sarif", "junit", "markdown", "html")]
    args = [root, "--format", "github", *IGNORE, *extra]
    for r in reports:
        args += ["--report", r]
    summary = out / "summary.md"
    summary.write_text("earlier step\n")
    env = {"GITHUB_STEP_SUMMARY": str(summary), "GITHUB_WORKSPACE": str(root.parent)} | (env or {})
    return run(*args, env=env)


# --------------------------------------------------------------------------------------------
# one run on a corrupted LeRobot-written recording


@pytest.fixture(scope="module")
def corrupted(tmp_path_factory):
    work = tmp_path_factory.mktemp("ci")
    root = work / "rec40"
    shutil.copytree(FIXTURES / "rec40", root)
    expected = corrupt_for_ci(root)
    out = work / "out"
    r = every_format(root, out)
    return root, out, r, expected


def test_one_run_writes_every_format(corrupted):
    root, out, r, expected = corrupted
    assert r.returncode == 1, r.stderr
    doc = json.loads((out / "r.json").read_text())
    got = {(f["check"], f["file"], f["episode"]) for f in doc["findings"]}
    assert set(expected) <= got
    assert doc["exit_code"] == 1 and doc["counts"]["error"] == 2


def test_github_annotations_and_step_summary(corrupted):
    root, out, r, _ = corrupted
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("::")]
    errors = [ln for ln in lines if ln.startswith("::error ")]
    warnings = [ln for ln in lines if ln.startswith("::warning ")]
    info_line = key_lines((root / INFO).read_text())[("total_frames",)]
    # paths relative to the workspace, info.json with the line of the key it is about
    assert errors[0] == (
        f"::error file=rec40/meta/info.json,line={info_line},title=info.totals::"
        "total_frames is 12330 but the episodes/tasks tables give 12325"
    )
    assert errors[1].startswith(f"::error file=rec40/{DATA},title=data.nan::episode 10: ")
    assert len(errors) == 2 and 4 <= len(warnings) <= 10
    assert any("title=quality.frozen::episode 5:" in w for w in warnings)
    assert lines == errors + warnings  # most severe first
    summary = (out / "summary.md").read_text()
    assert summary.startswith("earlier step\n# Validation report")  # appended, not replaced
    assert "| `info.totals` | error | 1 |" in summary and "## `quality.jump`" in summary


def test_sarif_is_valid_and_locates_each_finding(corrupted):
    root, out, _, _ = corrupted
    doc = json.loads((out / "r.sarif").read_text())
    assert sarif_errors(doc) == []
    run_ = doc["runs"][0]
    rules = [rule["id"] for rule in run_["tool"]["driver"]["rules"]]
    assert rules == select_checks("all,-layout")  # one rule per check that ran
    assert all(rule["properties"]["help"].startswith("docs/validate-checks.md#") for rule in
               run_["tool"]["driver"]["rules"])  # fmt: skip
    results = {r["ruleId"]: r for r in run_["results"]}
    levels = [r["level"] for r in run_["results"]]
    assert levels == sorted(levels, key=["error", "warning"].index)  # most severe first
    totals = results["info.totals"]["locations"][0]["physicalLocation"]
    assert totals["artifactLocation"] == {"uri": "rec40/meta/info.json", "uriBaseId": "%SRCROOT%"}
    assert totals["region"]["startLine"] == key_lines((root / INFO).read_text())[("total_frames",)]
    assert run_["originalUriBaseIds"]["%SRCROOT%"]["uri"] == root.parent.resolve().as_uri() + "/"
    frozen = results["quality.frozen"]["locations"][0]
    assert frozen["physicalLocation"]["artifactLocation"]["uri"] == f"rec40/{DATA}"
    kinds = {loc["kind"]: loc["fullyQualifiedName"] for loc in frozen["logicalLocations"]}
    assert kinds == {
        "episode": "episode 5",
        "frames": "episode 5 frames 0-110",
        "feature": "action",
    }
    jump = {loc["kind"]: loc for loc in results["quality.jump"]["locations"][0]["logicalLocations"]}
    assert jump["feature"]["fullyQualifiedName"] == "action[3]"
    nan = results["data.nan"]
    assert nan["level"] == "error" and nan["message"]["text"].startswith("episode 10: ")
    assert len(nan["partialFingerprints"]["episodekit/v1"]) == 16


def test_junit_is_read_back_and_valid(corrupted):
    _, out, _, _ = corrupted
    path = out / "r.junit"
    junit_valid(path)
    xml = junitparser.JUnitXml.fromfile(str(path))
    suites = list(xml)
    assert len(suites) == 1
    cases = {c.name: c for c in suites[0]}
    assert list(cases) == select_checks("all,-layout")  # a test case per check
    failed = {name for name, c in cases.items() if not c.is_passed}
    assert failed == {"info.totals", "data.nan"}  # the warnings do not fail
    (nan,) = cases["data.nan"].result
    assert isinstance(nan, junitparser.Failure) and nan.type == "error"
    assert nan.message == f"{DATA} episode 10: 1 row with NaN/inf in action"
    assert "quality.frozen" not in failed and "episode 5" in cases["quality.frozen"].system_out
    assert "docs/validate-checks.md#quality.frozen" in cases["quality.frozen"].system_out
    assert suites[0].failures == 2 and suites[0].tests == len(cases)


def test_markdown_and_html_reports(corrupted):
    root, out, _, _ = corrupted
    md = (out / "r.markdown").read_text()
    assert "**FAILED**" in md and "## `data.nan`" in md and "help: `docs/validate-checks.md#" in md
    page = (out / "r.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "FAILED" in page
    for check, _, _ in CI_FINDINGS:
        assert f"<code>{check}</code>" in page
    # self-contained: no script, no stylesheet or font to fetch, every image inline
    lowered = page.lower()
    assert "<script" not in lowered and "<link" not in lowered and "url(" not in lowered
    assert "http://" not in lowered and "https://" not in lowered
    assert page.count("<img ") == page.count('<img alt="plot" src="data:image/png;base64,')
    pytest.importorskip("matplotlib")
    # episode lengths, action and observation.state distributions, the flagged episodes' traces
    assert "<h2>Episode lengths</h2>" in page and "<h2>Feature distributions</h2>" in page
    assert "<h2>Flagged episodes</h2>" in page and page.count("<img ") >= 3 + 3
    assert "plot skipped" not in page


def test_html_without_matplotlib_is_a_plain_page(corrupted, monkeypatch):
    root, _, _, _ = corrupted
    from episodekit.validate.html import format_html
    from episodekit.validate.runner import validate

    report = validate(str(root), checks="info,data", ignore="info.fps")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    page, note = format_html(report)
    assert "<img" not in page and "No plots" in page and "episodekit[plots]" in note
    assert "<code>data.nan</code>" in page


@pytest.mark.parametrize("name", CLEAN)
def test_clean_lerobot_datasets_give_no_finding_in_any_format(tmp_path, name):
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    r = every_format(root, tmp_path / "out")
    out = tmp_path / "out"
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [ln for ln in r.stdout.splitlines() if ln.startswith("::")]
    assert json.loads((out / "r.json").read_text())["findings"] == []
    sarif = json.loads((out / "r.sarif").read_text())
    assert sarif_errors(sarif) == [] and sarif["runs"][0]["results"] == []
    junit_valid(out / "r.junit")
    cases = list(next(iter(junitparser.JUnitXml.fromfile(str(out / "r.junit")))))
    assert cases and all(c.is_passed and not c.system_out for c in cases)
    assert "No findings." in (out / "r.markdown").read_text()
    assert "No findings." in (out / "summary.md").read_text()
    assert "No findings." in (out / "r.html").read_text()


# --------------------------------------------------------------------------------------------
# the registry


def test_registry_is_what_the_passes_report():
    ids = [c.id for c in registry.REGISTRY]
    assert len(ids) == len(set(ids))
    assert set(ids) == produced()
    assert all(c.severity in ("error", "warning") and c.title for c in registry.REGISTRY)
    assert registry.get("data.nan").help == "docs/validate-checks.md#data.nan"
    page = (TESTS.parent / "docs" / "validate-checks.md").read_text()
    assert all(f'<a id="{i}"></a>' in page for i in ids)  # every help link lands


def test_select_ignore_and_the_checks_alias(tmp_path):
    assert select_checks("data", ignore="data.nan,data.rows") == [
        c for c in select_checks("data") if c not in ("data.nan", "data.rows")
    ]
    assert select_checks("all", ignore="-layout") == select_checks("all,-layout")
    root = tmp_path / "r"
    shutil.copytree(FIXTURES / "rec40", root)
    a = json.loads(run(root, "--checks", "data.rows,info", "--json").stdout)["checks_run"]
    b = json.loads(run(root, "--select", "data.rows,info", "--json").stdout)["checks_run"]
    assert a == b == select_checks("data.rows,info")
    r = run(root, "--ignore", "nope")
    assert r.returncode == 2 and "--ignore" in r.stderr and "unknown check 'nope'" in r.stderr
    r = run(root, "--json", "--format", "sarif")
    assert r.returncode == 2 and "--json" in r.stderr
    plain = json.loads(run(root, "--json", *IGNORE).stdout)
    fmt = json.loads(run(root, "--format", "json", *IGNORE).stdout)
    assert {**plain, "seconds": 0} == {**fmt, "seconds": 0}


def test_report_paths_are_checked_before_validating(tmp_path):
    root = tmp_path / "r"
    shutil.copytree(FIXTURES / "rec40", root)
    for spec, words in (
        (f"sarif:{tmp_path / 'no' / 'x.sarif'}", "no such folder"),
        (f"html:{tmp_path}", "is a folder"),
        ("junit:", "no path"),
    ):
        r = run(root, "--report", spec)
        assert r.returncode == 2 and words in r.stderr and "--report" in r.stderr, r.stderr
    r = run(root, "--report", f"json:{tmp_path / 'a'}", "--report", f"sarif:{tmp_path / 'a'}")
    assert r.returncode == 2 and "named twice" in r.stderr
    assert not (tmp_path / "a").exists()
    r = run(root, "--report", str(tmp_path / "bare.md"), *IGNORE)  # a bare path: Markdown
    assert r.returncode == 0 and (tmp_path / "bare.md").read_text().startswith("# Validation")


# --------------------------------------------------------------------------------------------
# GitHub's 10 + 10 annotations


def _f(check: str, i: int, severity: str = "error", file: str = DATA) -> Finding:
    return Finding(check, severity, f"problem {i}", file, i)


def test_annotations_fit_ten_per_level_and_carry_every_check():
    errs = [_f("data.nan", i) for i in range(20)] + [_f("data.rows", i) for i in range(6)]
    errs += [_f("info.totals", 0, file=INFO)]
    report = Report("/r", errs)
    lines = annotations(report)
    assert len(lines) == 10 and all(ln.startswith("::error ") for ln in lines)
    # every check present; the slots left go to the checks with findings left, in turn
    assert sum("title=info.totals::" in ln for ln in lines) == 1
    nan = [ln for ln in lines if "title=data.nan" in ln]
    rows = [ln for ln in lines if "title=data.rows" in ln]
    assert len(nan) + len(rows) == 9
    assert nan[-1].split("::")[1].endswith(f"title=data.nan ({20 - len(nan) + 1} more findings)")
    assert rows[-1].split("::")[1].endswith(f"title=data.rows ({6 - len(rows) + 1} more findings)")
    assert "episodes " in nan[-1] and "docs/validate-checks.md#data.nan" in nan[-1]
    # more checks than slots: nine checks of their own, the tenth names the rest with counts
    many = [_f(c, i, "warning") for i, c in enumerate(registry.ids("quality")[:13])]
    lines = annotations(Report("/r", many))
    assert len(lines) == 10
    assert lines[-1].split("::")[1].endswith("title=4 more checks (4 findings)")
    assert "quality." in lines[-1].split("::")[2] and "(1)" in lines[-1]
    # few findings: one annotation each
    assert len(annotations(Report("/r", errs[:3]))) == 3


def test_strict_warnings_are_errors_and_baseline_findings_a_notice():
    report = Report("/r", [_f("quality.jump", 1, "warning"), _f("data.nan", 2)], strict=True)
    assert [ln.split(" ")[0] for ln in annotations(report)] == ["::error", "::error"]
    from episodekit.validate.baseline import entry

    report.strict = False
    report.apply_baseline([entry(report.findings[1])], "b.json")
    lines = annotations(report)
    assert lines[0].startswith("::warning ") and "title=quality.jump" in lines[0]
    assert lines[1].startswith("::notice title=episodekit baseline::1 findings are in the baseline")
    assert len(lines) == 2 and report.exit_code() == 0


# --------------------------------------------------------------------------------------------
# SARIF and JUnit limits


def test_sarif_keeps_the_most_severe_within_githubs_limits():
    findings = [_f("quality.jump", i, "warning") for i in range(80)]
    findings += [_f("data.nan", i) for i in range(40)]
    report = Report("/r", findings, checks_run=["data.nan", "quality.jump"])
    doc = sarif_document(report, max_results=50)
    assert sarif_errors(doc) == []
    results = doc["runs"][0]["results"]
    assert len(results) == 50 and [r["level"] for r in results[:40]] == ["error"] * 40
    assert doc["runs"][0]["properties"]["truncated"] == {"kept": 50, "total": 120}
    note = doc["runs"][0]["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"]
    assert note.startswith("50 of 120 results kept")
    small = sarif_document(report, max_gzip_bytes=3000)  # the gzipped size bounds it too
    import gzip

    from episodekit.validate.sarif import _dumps

    kept = small["runs"][0]["properties"]["truncated"]["kept"]
    assert 0 < kept < 120 and len(gzip.compress(_dumps(small).encode())) <= 3000
    whole = sarif_document(report)["runs"][0]
    assert len(whole["results"]) == 120 and "truncated" not in whole["properties"]
    assert small["runs"][0]["results"] == whole["results"][:kept]  # the most severe first


def test_junit_lists_the_first_findings_and_counts_the_rest(tmp_path):
    nans = [_f("data.nan", i) for i in range(70)]
    report = Report("/r", nans, checks_run=["data.nan", "data.rows"])
    report.findings.append(Finding("data.rows", "error", "bad \x00 byte", DATA, 3))
    path = tmp_path / "j.xml"
    path.write_text(format_junit(report))
    junit_valid(path)
    cases = {c.name: c for c in next(iter(junitparser.JUnitXml.fromfile(str(path))))}
    assert len(cases["data.nan"].result) == 50
    assert cases["data.nan"].system_out.startswith("70 failing findings; the first 50 are listed")
    assert cases["data.rows"].result[0].message.endswith("bad \\x00 byte")


def test_info_json_key_lines():
    text = (
        '{\n "a": 1,\n "features": {\n  "x\\"y": {"shape": [1,\n 2]},\n  "z": {}\n },\n'
        ' "b": [{"c": 2}]\n}'
    )
    lines = key_lines(text)
    assert lines[("a",)] == 2 and lines[("features",)] == 3 and lines[("features", 'x"y')] == 4
    assert lines[("features", 'x"y', "shape")] == 4 and lines[("features", "z")] == 6
    assert lines[("b",)] == 8 and lines[("b", "c")] == 8


# --------------------------------------------------------------------------------------------
# baselines


def test_baseline_passes_known_findings_and_fails_only_on_new_ones(corrupted, tmp_path):
    root, _, _, expected = corrupted
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    base = tmp_path / "baseline.json"
    r = run(copy, "--write-baseline", base, *IGNORE)
    assert r.returncode == 0, r.stdout  # its findings are the baseline now
    first = base.read_bytes()
    entries = json.loads(first)["findings"]
    assert {(e["check"], e["file"], e["episode"]) for e in entries} >= set(expected)
    # the same bytes on a rerun, from another folder and another copy of the data
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(copy, elsewhere / "data-copy")
    run(elsewhere / "data-copy", "--write-baseline", base, *IGNORE, cwd=elsewhere)
    assert base.read_bytes() == first
    r = run(copy, "--baseline", base, *IGNORE)
    assert r.returncode == 0 and "0 new, 0 gone" in r.stdout, r.stdout
    # one new corruption: the run fails and names only it
    from corruptions import _edit_list_column

    _edit_list_column(copy, 20, "observation.state", nan=True)
    r = run(copy, "--baseline", base, *IGNORE, "--format", "github")
    assert r.returncode == 1
    errors = [ln for ln in r.stdout.splitlines() if ln.startswith("::error ")]
    assert len(errors) == 1 and "title=data.nan::episode 20: " in errors[0], r.stdout
    doc = json.loads(run(copy, "--baseline", base, *IGNORE, "--json").stdout)
    new = [f for f in doc["findings"] if f["baseline"] == "new"]
    failing = [(f["check"], f["episode"]) for f in new if f["severity"] == "error"]
    assert failing == [("data.nan", 20)]
    assert {f["episode"] for f in new} == {20}
    assert doc["baseline"]["gone"] == []
    # a fixed finding is reported as gone
    info = json.loads((copy / INFO).read_text())
    edit_info(copy, total_frames=info["total_frames"] - 5)
    doc = json.loads(run(copy, "--baseline", base, *IGNORE, "--json").stdout)
    assert [(g["check"], g["file"]) for g in doc["baseline"]["gone"]] == [("info.totals", INFO)]
    sarif = run(copy, "--baseline", base, *IGNORE, "--format", "sarif").stdout
    states = {r["ruleId"]: r["baselineState"] for r in json.loads(sarif)["runs"][0]["results"]}
    assert states["quality.frozen"] == "unchanged" and "data.nan" in states


def test_baseline_file_problems_exit_2(tmp_path):
    root = tmp_path / "r"
    shutil.copytree(FIXTURES / "rec40", root)
    r = run(root, "--baseline", tmp_path / "none.json")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
        "none.json: no such file (write one with --write-baseline)"
    )
    (tmp_path / "bad.json").write_text('{"findings": []}')
    r = run(root, "--baseline", tmp_path / "bad.json", "--json")
    assert r.returncode == 2 and "not a baseline" in json.loads(r.stdout)["error"]
    # a baseline this run writes may not exist yet
    r = run(root, "--baseline", tmp_path / "b.json", "--write-baseline", tmp_path / "b.json")
    assert r.returncode == 0 and (tmp_path / "b.json").exists()


# --------------------------------------------------------------------------------------------
# episodekit.toml


def test_episodekit_toml_at_the_root_and_the_cli_wins(tmp_path):
    root = tmp_path / "r"
    shutil.copytree(FIXTURES / "rec40", root)
    assert run(root).returncode == 0  # layout warnings do not fail by default
    config = '[validate]\nfail-on = "warning"\nselect = "info,layout"\n'
    (root / "episodekit.toml").write_text(config)
    doc = json.loads(run(root, "--json").stdout)
    assert doc["exit_code"] == 1 and set(doc["checks_run"]) == set(select_checks("info,layout"))
    doc = json.loads(run(root, "--json", "--fail-on", "error").stdout)  # the CLI wins
    assert doc["exit_code"] == 0
    doc = json.loads(run(root, "--json", "--select", "tasks").stdout)
    assert doc["checks_run"] == ["tasks.table"] and doc["exit_code"] == 0
    (root / "episodekit.toml").write_text(
        '[validate]\nignore = ["layout"]\nfail-on = "warning"\nbaseline = "known.json"\n'
    )
    r = run(root)
    assert r.returncode == 2 and "known.json: no such file" in r.stderr  # relative to the root
    edit_info(root, total_frames=1)
    assert run(root, "--write-baseline", root / "known.json").returncode == 0
    r = run(root)
    assert r.returncode == 0 and "1 known (do not fail)" in r.stdout, r.stdout
    (root / "episodekit.toml").write_text("[validate]\nselct = 'info'\n")
    r = run(root)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"Error: {root / 'episodekit.toml'}: unknown key 'selct' in [validate]; "
        "known: select, ignore, fail-on, baseline"
    )
    (root / "episodekit.toml").write_text("[validate\n")
    r = run(root)
    assert r.returncode == 2 and "episodekit.toml: cannot read" in r.stderr
