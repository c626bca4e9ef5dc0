"""Every command, run as a user runs it (a subprocess), against every kind of bad input.

Exit codes have one meaning each: 0 success, 1 the data or a check failed, 2 usage or
environment. An expected failure is one line on stderr (``Error: ...``), never a traceback, and
every option it names exists on that command. The subprocesses run a few at a time (they mostly
wait on interpreter start-up), which keeps this file to seconds.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from episodekit.cli import main

REPO = Path(__file__).resolve().parents[2]
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# No network here; an endpoint that refuses connections makes that certain.
ENV = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
ENV.pop("EPISODEKIT_DEBUG", None)
UNREACHABLE = "hf://datasets/nobody/nothing"


def commands() -> dict[str, click.Command]:
    """'prep rowgroups' -> its click command, for every leaf command."""
    out = {}

    def walk(prefix: list[str], cmd: click.Command) -> None:
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk([*prefix, name], sub)
        else:
            out[" ".join(prefix)] = cmd

    walk([], main)
    return out


COMMANDS = commands()
READERS = [name for name, c in COMMANDS.items() if name not in ("sample", "import")]  # a dataset
REQUIRED = {"metadata plan": ["--world-size", "2"]}  # required options, valid values


def options_of(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}


EPISODEKIT = str(Path(sys.executable).parent / "episodekit")  # the console script


def run(args: list[str], code: str | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-c", code, *args] if code else [EPISODEKIT, *args]
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=REPO, timeout=120)


def run_all(cases: list[list[str]]) -> list[subprocess.CompletedProcess]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(run, cases))


def assert_one_line_error(cmd_name: str, p: subprocess.CompletedProcess, code: int = 2) -> str:
    what = f"episodekit {cmd_name}: rc={p.returncode}\nstdout={p.stdout}\nstderr={p.stderr}"
    assert p.returncode == code, what
    assert "Traceback" not in p.stderr + p.stdout, what
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), what
    assert "np.float64(" not in lines[0] and "np.int64(" not in lines[0], what
    for opt in OPTION.findall(lines[0]):
        assert opt in options_of(COMMANDS[cmd_name]) | {"--help"}, (
            f"hint names {opt}, unknown to: {what}"
        )
    return lines[0]


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("roots")
    (base / "afile.txt").write_text("not a dataset\n")
    (base / "empty").mkdir()
    return {
        "missing": str(base / "nope"),
        "file": str(base / "afile.txt"),
        "empty": str(base / "empty"),
        "unreachable hub": UNREACHABLE,
    }


def test_every_command_has_help():
    p = run(["--help"])  # the console script itself, once
    assert p.returncode == 0 and "Usage: episodekit" in p.stdout and not p.stderr
    for name in [*COMMANDS, "prep", "metadata"]:  # the rest in-process: same parser, faster
        r = CliRunner().invoke(main, [*name.split(), "--help"])
        assert r.exit_code == 0 and "Usage:" in r.stdout, name
        assert name not in COMMANDS or "--debug" in r.stdout, name


def test_a_bare_group_prints_its_help_and_every_command_has_debug():
    for args in ([], ["prep"], ["metadata"]):
        p = run(args)
        assert p.returncode == 2 and "Usage:" in p.stderr + p.stdout and "Error" not in p.stderr
    assert all("--debug" in options_of(c) for c in COMMANDS.values())


def test_every_reader_on_every_bad_root(roots):
    cases = [(name, kind) for name in READERS for kind in roots]
    results = run_all(
        [[*name.split(), roots[kind], *REQUIRED.get(name, [])] for name, kind in cases]
    )
    for (name, kind), p in zip(cases, results):
        line = assert_one_line_error(name, p)
        assert roots[kind] in line, (name, kind, line)
        if kind == "unreachable hub":
            assert "cannot reach" in line, line
        if kind == "empty":
            assert line.count("info.json") == 1, line


def test_sample_refuses_a_file_or_a_url(roots):
    for p in run_all([["sample", roots["file"]], ["sample", UNREACHABLE]]):
        assert_one_line_error("sample", p)


def bad_values(cmd: click.Command) -> list[tuple[str, str]]:
    """(option, value) pairs below each numeric option's range, and a 0 world size."""
    out = []
    for p in cmd.params:
        if not isinstance(p, click.Option) or p.hidden:
            continue
        t = p.type
        if isinstance(t, (click.IntRange, click.FloatRange)) and t.min is not None:
            bad = t.min - 1 if isinstance(t, click.IntRange) and not t.min_open else t.min
            out.append((p.opts[0], str(-5 if isinstance(t, click.FloatRange) else bad)))
        if p.name in ("world_size", "world_sizes"):
            out.append((p.opts[0], "0"))
            out.append((p.opts[0], "a,b"))
        if isinstance(t, click.Choice):
            out.append((p.opts[0], "no-such-choice"))
    return out


# The values the issue names run as a user runs them; every other bad value runs in-process
# (the same parser and error path, without ~0.3 s of interpreter start-up each).
AS_A_USER = {("--world-size", "0"), ("--target-mb", "-5"), ("--jobs", "0"), ("--workers", "0")}


def test_every_bad_option_value_exits_2(make_sample):
    root = str(make_sample(episodes=20, copy=False))
    cases = []
    for name, cmd in COMMANDS.items():
        target = [str(Path(root).parent / "new-sample")] if name == "sample" else [root]
        for opt, value in bad_values(cmd):
            extra = [] if opt == "--world-size" else REQUIRED.get(name, [])
            cases.append((name, opt, value, [*name.split(), *target, *extra, opt, value]))
    assert AS_A_USER <= {(c[1], c[2]) for c in cases}
    user = [c for c in cases if (c[1], c[2]) in AS_A_USER]
    for (name, opt, _, _), p in zip(user, run_all([c[3] for c in user])):
        line = assert_one_line_error(name, p)
        assert opt in line, (name, opt, line)
    for name, opt, _, args in cases:
        r = CliRunner().invoke(main, args)
        p = subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)
        line = assert_one_line_error(name, p)
        assert opt in line, (name, opt, line)
    assert not (Path(root).parent / "new-sample").exists()


MISSING_RAY = (
    "import sys\nsys.modules['ray'] = None\nfrom episodekit.cli import main\nmain(sys.argv[1:])"
)


def test_executor_ray_without_ray_is_an_environment_error(make_sample):
    root = make_sample(episodes=20)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    names = [n for n, c in COMMANDS.items() if "--executor" in options_of(c)]
    assert {"prepare", "prep rowgroups", "validate"} <= set(names)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(
            pool.map(
                lambda n: run([*n.split(), str(root), "--executor", "ray"], code=MISSING_RAY),
                names,
            )
        )
    for name, p in zip(names, results):
        line = assert_one_line_error(name, p)
        assert "pip install 'episodekit[ray]'" in line, line
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # nothing written


def test_debug_shows_the_traceback(roots):
    p = run(["info", roots["unreachable hub"], "--debug"])
    assert p.returncode != 0 and "Traceback" in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "episodekit.cli", "info", UNREACHABLE],  # the module form too
        capture_output=True,
        text=True,
        env={**ENV, "EPISODEKIT_DEBUG": "1"},
        timeout=120,
    )
    assert "Traceback" in p.stderr


def test_a_failed_check_exits_1_a_clean_root_0(make_sample):
    root = make_sample(episodes=20)
    assert run(["validate", str(root)]).returncode == 0
    (root / "meta/tasks.parquet").write_bytes(b"garbage")
    p = run(["validate", str(root)])
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    p = run(["info", str(root)])
    assert_one_line_error("info", p, code=1)


def _string_constants(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
    return out


def test_every_option_named_in_a_message_exists():
    """Hints in the library and the CLI name options some command has (a renamed option
    must not leave a stale hint behind)."""
    known = set().union(*(options_of(c) for c in COMMANDS.values())) | {"--help", "--version"}
    folders = ["episodekit", "core", "prep", "metadata", "validate", "loaders"]
    unknown = {}
    for folder in folders:
        for path in (REPO / folder).rglob("*.py"):
            for text in _string_constants(path):
                for opt in OPTION.findall(text):
                    if opt not in known:
                        unknown.setdefault(opt, str(path.relative_to(REPO)))
    assert not unknown, unknown


def test_a_closed_stdout_is_not_a_hub_error(make_sample):
    """`episodekit ... | head` stopping early used to end in 'cannot reach the server: [Errno 32]
    Broken pipe' (BrokenPipeError is a ConnectionError): now silent, exit 2, no traceback."""
    root = make_sample(episodes=6)
    p = subprocess.Popen(
        [sys.executable, "-m", "episodekit.cli", "metadata", "plan", str(root), "--world-size=2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    p.stdout.close()  # the reader goes away before the command writes anything
    err = p.stderr.read()
    assert p.wait() == 2 and err == "", err


def test_import_of_what_is_no_source_is_one_line(roots, tmp_path):
    """import's SRC is not a dataset: a missing path, a file and a folder of no known layout are
    each one line naming the path, exit 2, and no --out is made."""
    kinds = ("missing", "file", "empty")
    out = tmp_path / "out"
    results = run_all([["import", roots[k], "--out", str(out)] for k in kinds])
    for kind, p in zip(kinds, results):
        line = assert_one_line_error("import", p)
        assert roots[kind] in line, (kind, line)
    assert not out.exists()
