"""action.yml, the composite GitHub Action: valid against GitHub's action schema (the one
check-jsonschema ships), and its steps run the way a runner runs them: each ``run:`` step with
``bash --noprofile --norc -eo pipefail``, its ``env:`` expressions substituted from the inputs,
``github.*``, ``runner.*`` and earlier steps' outputs, in a workspace with GITHUB_OUTPUT,
GITHUB_ENV, GITHUB_PATH and GITHUB_STEP_SUMMARY files; ``uses:`` steps (the SARIF upload) are
not run, but their ``if:`` and inputs are evaluated and must name the SARIF the run wrote."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))  # corruptions.py, source_tree.py
from corruptions import CI_FINDINGS, corrupt_for_ci  # noqa: E402
from source_tree import source_repo  # noqa: E402

FIXTURES = TESTS / "fixtures" / "lerobot"
ACTION = REPO / "action.yml"
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]


def test_action_is_valid_against_githubs_action_schema():
    checker = Path(sys.executable).parent / "check-jsonschema"
    r = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.github-actions", str(ACTION)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    action = yaml.safe_load(ACTION.read_text())
    assert set(action["inputs"]) >= {"root", "args", "fail-on", "baseline"}
    assert action["runs"]["using"] == "composite"


class Runner:
    """Enough of a GitHub runner to run a composite action's steps in a temp folder."""

    def __init__(
        self, tmp: Path, workspace: Path, inputs: dict, action_path: Path, path_dirs: list
    ):
        action = yaml.safe_load(ACTION.read_text())
        self.steps = action["runs"]["steps"]
        self.inputs = {k: str(v.get("default", "")) for k, v in action["inputs"].items()}
        unknown = set(inputs) - set(self.inputs)
        assert not unknown, unknown
        self.inputs.update(inputs)
        self.workspace, self.temp = workspace, tmp / "runner-temp"
        self.temp.mkdir(parents=True)
        self.files = {k: tmp / k.lower() for k in ("GITHUB_ENV", "GITHUB_PATH")}
        self.files["GITHUB_STEP_SUMMARY"] = tmp / "step-summary.md"
        for f in self.files.values():
            f.write_text("")
        self.action_path = action_path
        self.path = [str(p) for p in path_dirs]
        self.outputs: dict[str, dict[str, str]] = {}
        self.env: dict[str, str] = {}
        self.log: list[tuple[str, int, str]] = []  # (step name, exit code, stdout)
        self.skipped: list[dict] = []

    def value(self, expr: str) -> str:
        head, _, rest = expr.partition(".")
        if head == "inputs":
            return self.inputs[rest]
        if expr == "github.action_path":
            return str(self.action_path)
        if expr == "runner.temp":
            return str(self.temp)
        m = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr)
        if m:
            return self.outputs.get(m.group(1), {}).get(m.group(2), "")
        raise AssertionError(f"expression this test does not know: {expr}")

    def substitute(self, text: str) -> str:
        return EXPR.sub(lambda m: self.value(m.group(1)), text)

    def condition(self, expr: str | None) -> bool:
        if expr is None:
            return True
        expr = EXPR.sub(lambda m: m.group(1), expr)
        ok = True
        for part in expr.split("&&"):
            m = re.fullmatch(r"\s*([\w.-]+)\s*(==|!=)\s*'([^']*)'\s*", part)
            assert m, f"condition this test does not know: {expr}"
            equal = self.value(m.group(1)) == m.group(3)
            ok = ok and (equal if m.group(2) == "==" else not equal)
        return ok

    def run(self) -> int:
        """Every step in order, as GitHub does; the exit code of the first failing step."""
        for step in self.steps:
            if not self.condition(step.get("if")):
                continue
            if "uses" in step:
                self.skipped.append(
                    {**step, "with": {k: self.substitute(str(v)) for k, v in step["with"].items()}}
                )
                continue
            code = self.run_step(step)
            if code != 0:
                return code
        return 0

    def run_step(self, step: dict) -> int:
        assert step["shell"] == "bash"
        output = self.temp / f"output-{len(self.log)}"
        output.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_"))}
        env.update(self.env)
        extra = [ln for ln in self.files["GITHUB_PATH"].read_text().splitlines() if ln]
        env["PATH"] = os.pathsep.join([*reversed(extra), *self.path, "/usr/bin", "/bin"])
        env.update({k: str(v) for k, v in self.files.items()})
        env.update(
            GITHUB_OUTPUT=str(output),
            GITHUB_ACTIONS="true",
            GITHUB_WORKSPACE=str(self.workspace),
            GITHUB_ACTION_PATH=str(self.action_path),
            RUNNER_TEMP=str(self.temp),
        )
        env.update({k: self.substitute(str(v)) for k, v in (step.get("env") or {}).items()})
        script = self.temp / "step.sh"
        script.write_text(self.substitute(step["run"]))
        r = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=self.workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
        self.log.append((step["name"], r.returncode, r.stdout + r.stderr))
        if step.get("id"):
            pairs = [ln.split("=", 1) for ln in output.read_text().splitlines() if "=" in ln]
            self.outputs[step["id"]] = dict(pairs)
        for ln in self.files["GITHUB_ENV"].read_text().splitlines():
            if "=" in ln:
                k, v = ln.split("=", 1)
                self.env[k] = v
        return r.returncode

    def stdout_of(self, name: str) -> str:
        return next(out for n, _, out in self.log if n == name)


def sarif_valid(path: Path) -> dict:
    schema = json.loads((TESTS / "fixtures" / "schemas" / "sarif-schema-2.1.0.json").read_text())
    doc = json.loads(path.read_text())
    jsonschema.Draft4Validator(schema).validate(doc)
    return doc


@pytest.fixture
def workspace(tmp_path) -> Path:
    ws = tmp_path / "workspace"
    shutil.copytree(FIXTURES / "rec40", ws / "datasets" / "rec40")
    return ws


VENV_BIN = Path(sys.executable).parent  # episodekit of this checkout, for install: "false"


def test_action_steps_on_a_corrupted_root(tmp_path, workspace):
    root = workspace / "datasets" / "rec40"
    corrupt_for_ci(root)
    inputs = {"root": "datasets/rec40", "args": "--ignore layout", "install": "false"}
    runner = Runner(tmp_path, workspace, inputs, REPO, [VENV_BIN])
    assert runner.run() == 1  # the verdict step fails as validate did
    names = [n for n, _, _ in runner.log]
    assert names == ["Install episodekit", "Validate", "Verdict"]
    out = runner.outputs["validate"]
    assert out["exit-code"] == "1"
    report_dir = Path(out["report-dir"])
    assert Path(out["sarif"]) == report_dir / "validate.sarif"
    # annotations on the step's log, workspace-relative, most severe first
    log = runner.stdout_of("Validate")
    errors = [ln for ln in log.splitlines() if ln.startswith("::error ")]
    assert errors[0].startswith("::error file=datasets/rec40/meta/info.json,line=")
    assert "title=data.nan::episode 10:" in errors[1] and len(errors) == 2
    assert any(ln.startswith("::warning ") and "quality.frozen" in ln for ln in log.splitlines())
    # the job summary
    summary = runner.files["GITHUB_STEP_SUMMARY"].read_text()
    assert summary.startswith("# Validation report: `datasets/rec40`")
    assert "| `info.totals` | error | 1 |" in summary and "## `quality.frozen`" in summary
    # the SARIF upload step: its condition held, its input is the SARIF the run wrote
    (upload,) = runner.skipped
    assert upload["uses"].startswith("github/codeql-action/upload-sarif@")
    assert upload["with"]["sarif_file"] == out["sarif"]
    doc = sarif_valid(Path(upload["with"]["sarif_file"]))
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            for r in doc["runs"][0]["results"]}  # fmt: skip
    assert uris == {f"datasets/rec40/{f}" for f in ("meta/info.json", CI_FINDINGS[1][1])}
    # the other reports of the same run
    assert json.loads((report_dir / "validate.json").read_text())["exit_code"] == 1
    assert (report_dir / "validate.html").read_text().startswith("<!DOCTYPE html>")


def test_action_steps_with_a_baseline_and_fail_on(tmp_path, workspace):
    root = workspace / "datasets" / "rec40"
    corrupt_for_ci(root)
    base = workspace / "validate-baseline.json"
    r = subprocess.run(
        [*CLI, "validate", str(root), "--ignore", "layout", "--write-baseline", str(base)],
        capture_output=True,
    )
    assert r.returncode == 0
    inputs = {
        "root": "datasets/rec40",
        "args": "--ignore layout",
        "baseline": "validate-baseline.json",
        "install": "false",
        "upload-sarif": "false",
    }
    runner = Runner(tmp_path, workspace, inputs, REPO, [VENV_BIN])
    assert runner.run() == 0 and runner.outputs["validate"]["exit-code"] == "0"
    assert runner.skipped == []  # upload-sarif: false
    log = runner.stdout_of("Validate")
    assert "::notice title=episodekit baseline::" in log and "::error" not in log
    assert "## Baseline" in runner.files["GITHUB_STEP_SUMMARY"].read_text()
    # its findings' warnings are known too: failing on warnings changes nothing
    runner = Runner(tmp_path / "w", workspace, {**inputs, "fail-on": "warning"}, REPO, [VENV_BIN])
    assert runner.run() == 0


def test_action_fail_on(tmp_path, workspace):
    """rec40 as LeRobot wrote it has layout warnings only: they fail with fail-on warning."""
    inputs = {"root": "datasets/rec40", "install": "false", "upload-sarif": "false"}
    runner = Runner(tmp_path / "a", workspace, inputs, REPO, [VENV_BIN])
    assert runner.run() == 0
    assert "::warning file=datasets/rec40/data/" in runner.stdout_of("Validate")
    runner = Runner(tmp_path / "b", workspace, {**inputs, "fail-on": "warning"}, REPO, [VENV_BIN])
    assert runner.run() == 1 and runner.outputs["validate"]["exit-code"] == "1"
    assert "::error file=datasets/rec40/data/" in runner.stdout_of("Validate")


def test_action_steps_on_a_root_that_cannot_be_validated(tmp_path, workspace):
    inputs = {"root": "datasets/missing", "install": "false"}
    runner = Runner(tmp_path, workspace, inputs, REPO, [VENV_BIN])
    assert runner.run() == 2
    assert "sarif" not in runner.outputs["validate"]  # nothing to upload: the step is skipped
    assert runner.skipped == []
    assert "datasets/missing: no such folder" in runner.stdout_of("Validate")


def test_action_install_step_installs_episodekit_from_the_action(tmp_path, workspace):
    """install: "true" (the default): a venv in RUNNER_TEMP with episodekit installed from the
    action's folder (a copy of this checkout), put on PATH for the next steps."""
    action_path = source_repo(tmp_path / "action")
    inputs = {"root": "datasets/rec40", "args": "--ignore layout"}
    # PATH without this checkout's venv: only the installed episodekit can answer
    runner = Runner(tmp_path, workspace, inputs, action_path, [])
    assert runner.run() == 0, runner.log
    venv_bin = runner.temp / "episodekit-venv" / "bin"
    assert runner.files["GITHUB_PATH"].read_text().split() == [str(venv_bin)]
    assert (venv_bin / "episodekit").is_file()
    assert runner.outputs["validate"]["exit-code"] == "0"
    assert "No findings." in runner.files["GITHUB_STEP_SUMMARY"].read_text()
