"""Review fixes of the mixture commands (issue 16), as a user meets them: filters naming what the
source lacks, options that do nothing in mixture mode, one-line errors with the right exit code
and hints naming options that exist."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from episodekit.metadata.mixture.spec import MixtureError, parse_mixture, resolve_sources
from episodekit.sample import write_sample


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("review")
    a = write_sample(base / "a", episodes=12, tasks=3, seed=1, mean_length=30)
    b = write_sample(base / "b", episodes=8, tasks=2, seed=2, mean_length=20)
    return base, a, b


def run_cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "episodekit.cli", *args], capture_output=True, text=True, cwd=cwd
    )


def one_line_error(r) -> str:
    """The single stderr line of a failed command (asserting it is one line, no traceback)."""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    return lines[0]


def mix(a, b=None, **source0):
    sources = [{"root": str(a), "weight": 1, **source0}]
    if b is not None:
        sources.append({"root": str(b), "weight": 2, "name": "bee"})
    return {"sources": sources}


# -- 1. an episodes range beyond the source ------------------------------------------------------


@pytest.mark.parametrize("episodes", ["0:500", "3:13", "100:200"])
def test_range_beyond_the_source_is_an_error(roots, episodes):
    """'0:500' on a 12-episode source kept 0..11 silently (a list was checked): the mixture's
    weights changed without a word. Now an error naming the field, the range and the count."""
    _, a, b = roots
    with pytest.raises(MixtureError) as err:
        resolve_sources(parse_mixture({"sources": [
            {"root": str(b), "weight": 1}, {"root": str(a), "weight": 1, "episodes": episodes}
        ]}))  # fmt: skip
    msg = str(err.value)
    assert f"sources[1].episodes: range '{episodes}' goes beyond source 'a'" in msg, msg
    assert "has 12 episodes, indices 0..11" in msg


def test_range_inside_the_source_still_works(roots):
    _, a, _ = roots
    [s] = resolve_sources(parse_mixture(mix(a, episodes="3:12")))
    assert s.episode_index.tolist() == list(range(3, 12))


def test_cli_range_beyond_the_source(roots, tmp_path):
    _, a, b = roots
    spec = json.dumps(mix(a, b, episodes="0:500"))
    for cmd in (["info"], ["metadata", "plan", "--world-size", "1", "--out", str(tmp_path / "p")]):
        r = run_cli(*cmd, "--mixture", spec)
        assert r.returncode == 1
        line = one_line_error(r)
        assert "sources[0].episodes: range '0:500' goes beyond source 'a'" in line
        assert "12 episodes" in line
    assert not (tmp_path / "p").exists()


# -- 2. tasks the source does not have -----------------------------------------------------------


def test_unknown_task_indices_are_named(roots):
    """tasks: [99] said 'filters select no frames'; [1, 99, 7] silently kept task 1 only."""
    _, a, _ = roots
    with pytest.raises(MixtureError) as err:
        resolve_sources(parse_mixture(mix(a, tasks=[99])))
    msg = str(err.value)
    assert "sources[0].tasks: task indices [99] are not tasks of source 'a'" in msg, msg
    assert "has 3 tasks, indices 0..2" in msg and "select no frames" not in msg
    with pytest.raises(MixtureError, match=r"task indices \[7, 99\] are not tasks"):
        resolve_sources(parse_mixture(mix(a, tasks=[1, 99, 7])))
    with pytest.raises(MixtureError, match=r"sources\[0\].tasks: task 'nope' is not a task of"):
        resolve_sources(parse_mixture(mix(a, tasks=[0, "nope"])))


def test_cli_unknown_task_index(roots):
    _, a, b = roots
    r = run_cli("info", "--mixture", json.dumps(mix(a, b, tasks=[99])))
    assert r.returncode == 1
    assert "task indices [99] are not tasks of source 'a'" in one_line_error(r)


def test_task_index_matches_any_of_an_episode_tasks(roots, tmp_path):
    """A task index stands for its task string: an episode with two tasks is kept by the index
    of its second task, as by its string (the index matched only an episode's first task)."""
    import shutil

    from episodekit.core.dataset import open_dataset

    _, a, _ = roots
    root = tmp_path / "a"
    shutil.copytree(a, root)
    ds = open_dataset(str(root))
    names = ds.task_strings()
    [path] = list((root / "meta" / "episodes").rglob("*.parquet"))
    table = pq.read_table(path)
    tasks = table.column("tasks").to_pylist()
    first = next(i for i, t in enumerate(tasks) if t[0] != names[2])
    tasks[first] = [tasks[first][0], names[2]]  # episode `first` also does task 2
    col = table.schema.get_field_index("tasks")
    table = table.set_column(col, "tasks", [tasks])
    pq.write_table(table, path)
    ep = open_dataset(str(root)).column("episode_index")
    by_name = resolve_sources(parse_mixture(mix(root, tasks=[names[2]])))[0].episode_index
    by_index = resolve_sources(parse_mixture(mix(root, tasks=[2])))[0].episode_index
    assert int(ep[first]) in by_name.tolist()
    assert by_index.tolist() == by_name.tolist()


# -- 3. options that did nothing in mixture mode -------------------------------------------------


@pytest.fixture
def held(tmp_path):
    """hold(folder): this process holds folder's writer lock (as a running episodekit would)."""
    import contextlib

    from episodekit.core.lock import writer_lock

    with contextlib.ExitStack() as stack:
        yield lambda folder: stack.enter_context(writer_lock(folder))


def test_plan_no_wait_refuses_a_held_out_or_source(roots, tmp_path, held):
    """metadata plan --mixture writes DIR and the sources' cost tables: --no-wait was ignored
    (it wrote under another writer's lock); now exit 2 at once, one line, like ROOT mode."""
    _, a, b = roots
    spec = json.dumps(mix(a, b))
    out = tmp_path / "p"
    cmd = ("metadata", "plan", "--mixture", spec, "--world-size", "1", "--out", str(out))
    held(out)
    r = run_cli(*cmd, "--no-wait")
    assert r.returncode == 2
    assert "another episodekit process is writing here" in one_line_error(r)
    assert not (out / "ws1_nw1.json").exists()
    out2 = tmp_path / "p2"
    held(b)
    r = run_cli(*cmd[:-1], str(out2), "--no-wait")
    assert r.returncode == 2 and str(b) in one_line_error(r)
    assert not out2.exists()  # the folder it created is removed again


def test_stats_no_wait_refuses_a_held_out(roots, tmp_path, held):
    _, a, b = roots
    out = tmp_path / "p"
    held(out)
    r = run_cli("metadata", "stats", "--mixture", json.dumps(mix(a, b)), "--out", str(out),
                "--no-wait")  # fmt: skip
    assert r.returncode == 2
    assert "another episodekit process is writing here" in one_line_error(r)
    assert not (out / "stats.json").exists()


def test_prepare_no_wait_refuses_a_held_out_before_any_source(roots, tmp_path, held):
    import shutil

    _, a, b = roots
    a2, b2 = tmp_path / "a", tmp_path / "b"
    shutil.copytree(a, a2)
    shutil.copytree(b, b2)
    before = sorted(p.name for p in (a2 / "meta").iterdir())
    out = tmp_path / "p"
    held(out)
    r = run_cli("prepare", "--mixture", json.dumps(mix(a2, b2)), "--out", str(out),
                "--world-size", "1", "--workers", "1", "-j", "1", "--no-wait")  # fmt: skip
    assert r.returncode == 2
    assert "another episodekit process is writing here" in one_line_error(r)
    assert sorted(p.name for p in (a2 / "meta").iterdir()) == before  # no source touched


def test_stats_jobs_is_refused_with_mixture(roots, tmp_path):
    """The mixture stats run in one process: --jobs did nothing; refused like --executor."""
    _, a, b = roots
    r = run_cli("metadata", "stats", "--mixture", json.dumps(mix(a, b)), "--out",
                str(tmp_path / "p"), "--jobs", "2")  # fmt: skip
    assert r.returncode == 2
    line = one_line_error(r)
    assert "--jobs is for ROOT's stats; it does not combine with --mixture" in line
    assert "'episodekit metadata stats --help'" in line
    assert not (tmp_path / "p").exists()


def test_prepare_mixture_passes_jobs_and_wait_to_every_source(roots, tmp_path, monkeypatch):
    """prepare --mixture -j N --no-wait: each source's prepare gets jobs=N and wait=False."""
    from click.testing import CliRunner

    import episodekit.mixture as mixture_mod
    from episodekit.cli import main

    seen = []

    def fake_prepare(root, **kwargs):
        seen.append((root, kwargs["jobs"], kwargs["wait"]))
        return None  # a remote-like result: nothing prepared, plans still written

    monkeypatch.setattr(mixture_mod, "prepare", fake_prepare)
    _, a, b = roots
    r = CliRunner().invoke(main, ["prepare", "--mixture", json.dumps(mix(a, b)), "--out",
                                  str(tmp_path / "p"), "--world-size", "1", "--workers", "1",
                                  "-j", "3", "--no-wait"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert seen == [(str(a), 3, False), (str(b), 3, False)]


def test_info_max_files_is_refused_with_mixture(roots):
    _, a, b = roots
    r = run_cli("info", "--mixture", json.dumps(mix(a, b)), "--max-files", "3")
    assert r.returncode == 2
    assert "--max-files lists ROOT's data files; it does not combine with --mixture" in (
        one_line_error(r)
    )


def test_plan_mixture_without_world_size_names_an_option_that_works(roots, tmp_path):
    """The hint was 'give --world-size, --canonical-bins, or both', but --canonical-bins is
    refused with --mixture."""
    _, a, b = roots
    r = run_cli("metadata", "plan", "--mixture", json.dumps(mix(a, b)), "--out",
                str(tmp_path / "p"))  # fmt: skip
    assert r.returncode == 2
    line = one_line_error(r)
    assert "--world-size" in line and "--canonical-bins" not in line


@pytest.mark.parametrize("command", ["plan", "stats"])
def test_out_that_cannot_be_created_is_one_line_exit_2(roots, tmp_path, command):
    _, a, b = roots
    (tmp_path / "afile").write_text("x")
    extra = ["--world-size", "1"] if command == "plan" else []
    r = run_cli("metadata", command, "--mixture", json.dumps(mix(a, b)), "--out",
                str(tmp_path / "afile" / "p"), *extra)  # fmt: skip
    assert r.returncode == 2
    assert "cannot create the --out folder: Not a directory" in one_line_error(r)


def test_read_only_out_is_one_line_exit_2(roots, tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("running as root: chmod does not prevent writes")
    _, a, b = roots
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        for out in (ro, ro / "sub"):
            r = run_cli("metadata", "plan", "--mixture", json.dumps(mix(a, b)), "--out",
                        str(out), "--world-size", "1")  # fmt: skip
            assert r.returncode == 2 and "Permission denied" in one_line_error(r)
    finally:
        ro.chmod(0o755)


# -- 4. metadata stats --images lists the image features -----------------------------------------


def test_stats_images_text_summary_lists_image_features(make_sample):
    """The text summary listed only the numeric features: the image stats just computed were
    invisible without --json. Now: kind, shape, sampled frames, range and per-channel mean,
    the numbers of meta/stats.json."""
    import numpy as np

    root = make_sample(episodes=4, tasks=2, seed=5, mean_length=12, images=True)
    r = run_cli("metadata", "stats", str(root), "--images", "-j", "1")
    assert r.returncode == 0, r.stderr
    stats = json.loads((root / "meta" / "stats.json").read_text())
    [name] = [k for k in stats if "image" in k]
    s = {k: np.asarray(v, dtype=float) for k, v in stats[name].items()}
    lines = r.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith(name))
    assert lines[row].split() == [name, "image", "3,1,1", f"{int(s['count'][0]):,}"]
    means = " ".join(f"{v:.4g}" for v in s["mean"].ravel())
    assert lines[row + 1].split() == (
        f"range {s['min'].min():.4g} .. {s['max'].max():.4g}, mean per channel {means}".split()
    )
    again = run_cli("metadata", "stats", str(root))  # fresh, kept: still listed
    assert again.returncode == 0 and lines[row] in again.stdout.splitlines()


# -- 5. as a user runs them ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", [["metadata", "plan", "--world-size", "1"], ["metadata", "stats"], ["prepare"]]
)
def test_dataset_root_as_out_is_a_usage_error(roots, tmp_path, command):
    """--out naming a dataset root is a bad option value (exit 2, as a --out that is a file),
    refused before anything is written (no lock file left in the dataset either)."""
    import shutil

    _, a, b = roots
    a2 = tmp_path / "a"
    shutil.copytree(a, a2)
    before = sorted(str(p.relative_to(a2)) for p in a2.rglob("*"))
    r = run_cli(*command, "--mixture", json.dumps(mix(a2, b)), "--out", str(a2))
    assert r.returncode == 2
    assert f"--out: {a2} is a dataset root (it has meta/info.json)" in one_line_error(r)
    assert sorted(str(p.relative_to(a2)) for p in a2.rglob("*")) == before


@pytest.mark.parametrize(
    "command, hint",
    [
        (["info"], "use --mixture {spec}"),
        (["metadata", "stats"], "use --mixture {spec} --out {p}"),
        (["validate"], "run this on each source root (listed by 'episodekit info --mixture"),
    ],
)
def test_mixture_plan_folder_as_root_gets_a_hint(roots, tmp_path, command, hint):
    """`info DIR` / `validate DIR` on a mixture plan folder said only 'not a LeRobot dataset'."""
    from episodekit.metadata.mixture.plan import ensure_mixture_plans

    _, a, b = roots
    p = tmp_path / "p"
    ensure_mixture_plans(mix(a, b), p, [1], 1)
    r = run_cli(*command, str(p))
    assert r.returncode == 2
    line = one_line_error(r)
    assert "not a LeRobot dataset (no meta/info.json); it is a mixture plan folder" in line
    assert hint.format(spec=p / "mixture.json", p=p) in line


def test_empty_or_list_mixture_value(roots):
    r = run_cli("info", "--mixture", "")
    assert r.returncode == 2 and "--mixture is empty" in one_line_error(r)
    r = run_cli("info", "--mixture", '[{"root": "a", "weight": 1}]')  # JSON, not a file name
    assert r.returncode == 1
    assert "a mixture is a JSON object with a 'sources' list" in one_line_error(r)


@pytest.mark.parametrize(
    "root, said",
    [("nodir", "no such folder"), ("m.json", "is a file"), ("empty", "not a LeRobot dataset")],
)
def test_bad_source_root_names_the_field(roots, tmp_path, root, said):
    """A source root that does not exist said '<root>/meta/info.json: file is missing'."""
    _, a, _ = roots
    (tmp_path / "empty").mkdir()
    m = tmp_path / "m.json"
    sources = [{"root": str(a), "weight": 1}, {"root": root, "weight": 1}]
    m.write_text(json.dumps({"sources": sources}))
    r = run_cli("metadata", "plan", "--mixture", str(m), "--world-size", "1", "--out",
                str(tmp_path / "p"))  # fmt: skip
    assert r.returncode == 2  # a path to fix, like a missing ROOT
    line = one_line_error(r)
    assert f"sources[1].root ('{root}'): {tmp_path / root}: {said}" in line, line
    assert not (tmp_path / "p").exists()


def _tree(root):
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


def test_prepare_mixture_checks_filters_before_preparing_any_source(roots, tmp_path):
    """A bad filter of the last source was found only after every source had been prepared
    (row groups rewritten, tables written): now refused first, nothing touched."""
    import shutil

    _, a, b = roots
    a2 = tmp_path / "a"
    shutil.copytree(a, a2)
    before = _tree(a2)
    spec = {"sources": [{"root": str(a2), "weight": 1},
                        {"root": str(b), "weight": 1, "episodes": "0:500"}]}  # fmt: skip
    r = run_cli("prepare", "--mixture", json.dumps(spec), "--out", str(tmp_path / "p"),
                "--world-size", "1", "-j", "1")  # fmt: skip
    assert r.returncode == 1
    assert "sources[1].episodes: range '0:500' goes beyond source 'b'" in one_line_error(r)
    assert _tree(a2) == before and not (tmp_path / "p").exists()


def test_prepare_mixture_skips_a_world_size_it_cannot_plan(roots, tmp_path):
    """prepare ROOT skips a world size whose bins cannot all get a frame, with a warning;
    prepare --mixture failed after preparing every source ('fewer than the plan's bins')."""
    import shutil

    _, a, b = roots
    a2, b2 = tmp_path / "a", tmp_path / "b"
    shutil.copytree(a, a2)
    shutil.copytree(b, b2)
    spec = {"sources": [{"root": str(a2), "weight": 1},
                        {"root": str(b2), "weight": 1, "episodes": [0]}]}  # fmt: skip
    out = tmp_path / "p"
    r = run_cli("prepare", "--mixture", json.dumps(spec), "--out", str(out), "--world-size",
                "1,64", "--workers", "4", "-j", "1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "warning: world size 64 skipped: source 'b' has" in r.stdout
    assert "fewer than 256 bins (64 ranks x 4 workers)" in r.stdout
    assert (out / "ws1_nw4.json").exists() and not (out / "ws64_nw4.json").exists()
    r = run_cli("prepare", "--mixture", json.dumps(spec), "--out", str(tmp_path / "q"),
                "--world-size", "64", "--workers", "4", "-j", "1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "no mixture plan written: every --world-size was skipped" in r.stdout
    assert not (tmp_path / "q").exists()


def test_failed_plan_leaves_no_half_folder(roots, tmp_path):
    """A plan that fails (here: fewer epoch frames than bins) left DIR with only mixture.json,
    which `info DIR` then took for a mixture plan folder."""
    _, a, b = roots
    spec = {**mix(a, b), "epoch_frames": 3}
    out = tmp_path / "p"
    r = run_cli("metadata", "plan", "--mixture", json.dumps(spec), "--world-size", "2",
                "--workers", "2", "--out", str(out))  # fmt: skip
    assert r.returncode == 1
    assert "epoch_frames 3 is fewer than the plan's 4 bins" in one_line_error(r)
    assert not out.exists()


def test_help_of_mixture_options_names_every_refused_option():
    """Every option refused with --mixture is named in --mixture's help (and exists)."""
    import re

    refused = {
        ("prepare",): ["--push-to-hub", "--videos", "--videos-gop", "--canonical-bins"],
        ("metadata", "stats"): ["--images", "--executor", "--jobs"],
    }
    for cmd, flags in refused.items():
        r = run_cli(*cmd, "--help")
        text = re.sub(r"-\s+", "-", " ".join(r.stdout.split()))  # click wraps at hyphens
        mixture_help = text[text.index("--mixture FILE|JSON") :][:400]
        for flag in flags:
            assert flag in mixture_help, (cmd, flag)
            assert f"{flag} " in text.split("Options:")[1]  # the option exists


def test_mixture_given_as_the_plan_folder_names_its_mixture_json(roots, tmp_path):
    from episodekit.metadata.mixture.plan import ensure_mixture_plans

    _, a, b = roots
    p = tmp_path / "p"
    ensure_mixture_plans(mix(a, b), p, [1], 1)
    r = run_cli("info", "--mixture", str(p))
    assert r.returncode == 2
    line = one_line_error(r)
    assert f"{p}: is a folder, not a mixture file (a .json): give {p / 'mixture.json'}" in line
    assert run_cli("info", "--mixture", str(p / "mixture.json")).returncode == 0


def test_load_mixture_stats_hint_is_a_command_that_runs(roots, tmp_path):
    """The hints were 'run: episodekit metadata stats --mixture' (no file, no --out) and
    '--mixture ... --out DIR': now a full command, which this test runs."""
    import shlex

    from episodekit.metadata.mixture.plan import ensure_mixture_plans
    from episodekit.metadata.mixture.stats import load_mixture_stats

    _, a, b = roots
    p = tmp_path / "p"
    ensure_mixture_plans(mix(a, b), p, [1], 1)
    with pytest.raises(MixtureError) as err:
        load_mixture_stats(p)
    hint = f"episodekit metadata stats --mixture {p / 'mixture.json'} --out {p}"
    assert str(err.value).endswith(f"no mixture stats; compute them with: {hint}")
    assert run_cli(*shlex.split(hint)[1:]).returncode == 0
    assert load_mixture_stats(p)["action"]["mean"].shape == (14,)
    m = tmp_path / "other.json"
    m.write_text(json.dumps({**mix(a, b), "balance": "frames"}))
    with pytest.raises(MixtureError, match="stale: the mixture spec changed") as err:
        load_mixture_stats(p, str(m))
    assert str(err.value).endswith(f"episodekit metadata stats --mixture {m} --out {p}")


def test_mixture_file_not_utf8_or_huge_or_with_bom(roots, tmp_path):
    """A non-UTF-8 file was 'unexpected UnicodeDecodeError ... please report it'; a file over
    the read limit was cut and called invalid JSON; a BOM (Windows editors) is fine."""
    _, a, _ = roots
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'\xff\xfe{"sources": []}')
    r = run_cli("info", "--mixture", str(bad))
    assert r.returncode == 1
    assert f"{bad}: not UTF-8 text (invalid start byte at byte 0)" in one_line_error(r)
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * ((16 << 20) + 1))
    r = run_cli("info", "--mixture", str(huge))
    assert r.returncode == 1 and "larger than 16 MiB" in one_line_error(r)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(mix(a)).encode())
    assert run_cli("info", "--mixture", str(bom)).returncode == 0


@pytest.mark.parametrize("command", [["metadata", "plan"], ["prepare", "-j", "1"]])
def test_plan_never_overwrites_the_users_mixture_file(roots, tmp_path, command):
    """`--mixture mixture.json --out .` replaced the user's file by the normalized spec (roots
    made absolute); the plan folder's own DIR/mixture.json may still be rerun in place. A
    folder holding the user's files is refused (the one rule of output folders), `.` always."""
    import os
    import shutil

    _, a, b = roots
    shutil.copytree(a, tmp_path / "a")
    mine = tmp_path / "mixture.json"
    text = '{"sources": [{"root": "a", "weight": 1}]}\n'
    mine.write_text(text)
    r = run_cli(*command, "--mixture", "mixture.json", "--out", ".", "--world-size", "1",
                "--workers", "1", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2
    assert "refusing to write here: it is the current folder" in one_line_error(r)
    assert mine.read_text() == text and not (tmp_path / "ws1_nw1.json").exists()
    r = run_cli(*command, "--mixture", str(mine), "--out", str(tmp_path), "--world-size", "1",
                "--workers", "1")  # fmt: skip
    assert r.returncode == 2
    assert "refusing to write here: it holds the source dataset" in one_line_error(r)
    user = tmp_path / "user"
    user.mkdir()
    (user / "mixture.json").write_text('{"sources": [{"root": "../a", "weight": 1}]}\n')
    r = run_cli(*command, "--mixture", "user/mixture.json", "--out", "user", "--world-size", "1",
                "--workers", "1", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2
    assert "not written by episodekit (it holds 'mixture.json')" in one_line_error(r)
    assert sorted(os.listdir(user)) == ["mixture.json"]
    assert mine.read_text() == text and not (tmp_path / "ws1_nw1.json").exists()
    r = run_cli(*command, "--mixture", "mixture.json", "--out", "p", "--world-size", "1",
                "--workers", "1", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    again = run_cli(*command, "--mixture", "p/mixture.json", "--out", "p", "--world-size", "1",
                    "--workers", "1", cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0 and "fresh, kept" in again.stdout, again.stderr
    other = json.dumps({"sources": [{"root": str(b), "weight": 1}]})
    r = run_cli(*command, "--mixture", other, "--out", ".", "--world-size", "1", "--workers",
                "1", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2  # ./mixture.json is the user's, though not the --mixture given
    assert "refusing to write here" in one_line_error(r)
    assert mine.read_text() == text
    r = run_cli(*command, "--mixture", other, "--out", "p", "--world-size", "1", "--workers",
                "1", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr  # another mixture into a plan folder: replaced


def test_feature_setting_naming_no_feature_is_an_error(roots, tmp_path):
    """features.observation.stat (a typo) was accepted: the real feature stayed unpadded."""
    _, a, b = roots
    spec = {**mix(a, b), "features": {"observation.stat": {"pad_to": 32}}}
    r = run_cli("metadata", "plan", "--mixture", json.dumps(spec), "--world-size", "1",
                "--out", str(tmp_path / "p"))  # fmt: skip
    assert r.returncode == 1
    line = one_line_error(r)
    assert "features.observation.stat names no feature of any source (after rename)" in line
    assert "observation.state" in line and not (tmp_path / "p").exists()
    renamed = mix(a, b, rename={"action": "act"})
    renamed["features"] = {"act": {"pad_to": 32}, "action": {"drop": True}}  # b's action
    assert len(resolve_sources(parse_mixture(renamed))) == 2


def test_mixture_stats_status_line(roots, tmp_path):
    """A first run said 'written (no stats_meta.json)', as if something were wrong."""
    _, a, b = roots
    cmd = ("metadata", "stats", "--mixture", json.dumps(mix(a, b)), "--out", str(tmp_path / "p"))
    first = run_cli(*cmd).stdout.splitlines()[0]
    assert first == f"{tmp_path / 'p' / 'stats.json'}: written"
    assert run_cli(*cmd).stdout.splitlines()[0].endswith("stats.json: fresh")
    assert run_cli(*cmd, "--force").stdout.splitlines()[0].endswith("written (--force)")
    other = json.dumps({**mix(a, b), "balance": "frames"})
    r = run_cli("metadata", "stats", "--mixture", other, "--out", str(tmp_path / "p"))
    assert r.stdout.splitlines()[0].endswith("written (were stale: the mixture spec changed)")


def test_plan_of_a_replaced_mixture_is_stale(roots, tmp_path):
    """Planning another mixture into DIR rewrote DIR/mixture.json and the planned shapes only:
    a job of another shape loaded the old mixture's plan without a word."""
    import shlex

    from episodekit.loaders import StalePlanError, load_plan

    _, a, b = roots
    out = tmp_path / "p"
    base = ("metadata", "plan", "--out", str(out), "--workers", "1", "--world-size")
    assert run_cli(*base, "1,2", "--mixture", json.dumps(mix(a, b))).returncode == 0
    assert run_cli(*base, "1", "--mixture", json.dumps(mix(a))).returncode == 0
    assert load_plan(out, 1, 1).source_names == ["a"]
    with pytest.raises(StalePlanError, match="it is of another mixture than") as err:
        load_plan(out, 2, 1)
    hint = str(err.value).split("recompute it with: ")[1]
    assert run_cli(*shlex.split(hint)[1:]).returncode == 0
    assert load_plan(out, 2, 1).source_names == ["a"]


def test_deeply_nested_json_is_one_line():
    r = run_cli("info", "--mixture", "[" * 100_000)
    assert r.returncode == 1 and "JSON nested too deeply" in one_line_error(r)


def test_unreachable_remote_source_is_named(roots):
    """A hub source behind an unreachable server said only 'cannot reach the server: ...'."""
    import os

    _, a, _ = roots
    spec = {"sources": [{"root": str(a), "weight": 1},
                        {"root": "hf://datasets/owner/name", "weight": 1}]}  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-m", "episodekit.cli", "info", "--mixture", json.dumps(spec)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9"},
    )  # fmt: skip
    assert r.returncode == 2
    assert "sources[1].root ('name'): cannot open hf://datasets/owner/name (" in one_line_error(r)


def test_unreachable_source_of_a_plan_is_named(roots, tmp_path, monkeypatch):
    """Opening a mixture plan (load_plan, a loader's start) whose source cannot be reached names
    that source, and stays an environment problem (exit 2)."""
    import episodekit.metadata.mixture.plan_file as mf
    from episodekit.core.errors import EnvironmentProblem
    from episodekit.loaders import load_plan
    from episodekit.metadata.mixture.plan import ensure_mixture_plans

    _, a, b = roots
    spec = {"sources": [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 1}]}
    ensure_mixture_plans(spec, tmp_path / "p", [1], 1)
    real = mf.open_dataset

    def flaky(root, **kw):
        if str(root) == str(b):
            raise EnvironmentProblem("cannot reach the server: connection refused", str(root))
        return real(root, **kw)

    monkeypatch.setattr(mf, "open_dataset", flaky)
    with pytest.raises(EnvironmentProblem, match=r"source 'b': .*connection refused"):
        load_plan(tmp_path / "p", 1, 1)
