"""``episodekit convert``: v2.1 -> v3.0, verified, streamed, equal to LeRobot 0.6.1's own
conversion (tests/fixtures/lerobot/ref/v21vid8_ref.npz, made by LeRobot's converter and
LeRobotDataset: tools/make_convert_reference.py), ready for `prepare`."""

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

from episodekit.core.video import have_av

CLI = "import sys; from episodekit.cli import main; sys.exit(main())"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "lerobot"
V21 = FIXTURES / "v21vid8"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI, *map(str, args)], capture_output=True, text=True
    )


def rows(root: Path) -> pa.Table:
    files = sorted((root / "data").rglob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]).sort_by("index")


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("conv") / "v30"
    res = cli("convert", V21, "--out", out, "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "written" and doc["episodes"] == 8 and doc["video_files"] == 2
    assert doc["stats"].startswith("computed")  # the sample's v2.1 stats are empty
    return out


def test_rows_are_the_sources_bit_for_bit(converted):
    src, out = rows(V21), rows(converted)
    assert out.num_rows == src.num_rows == 1467
    for name in src.column_names:
        assert out[name].equals(src[name]), name
    info = json.loads((converted / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_frames"] == 1467
    assert info["data_path"].startswith("data/chunk-{chunk_index:03d}")
    assert "total_chunks" not in info and "total_videos" not in info


@pytest.mark.skipif(not have_av(), reason="needs PyAV")
def test_samples_equal_lerobot_061_conversion(converted):
    """Our loader on our conversion gives LeRobot's sample (read by LeRobotDataset from
    LeRobot's own conversion) at every reference index: data, delta windows, pads, frames."""
    from episodekit.loaders import FrameDataset

    ref = dict(np.load(FIXTURES / "ref/v21vid8_ref.npz"))
    delta = json.loads(str(ref.pop("delta")))
    ref.pop("notes")
    fds = FrameDataset(converted, delta_timestamps=delta, speed=False, video_backend="pyav")
    for j, g in enumerate(ref["index"]):
        s = fds[int(g)]
        for k, v in ref.items():
            if k == "task":
                assert s["task"] == str(v[j]), (j, k)
                continue
            np.testing.assert_array_equal(np.asarray(s[k]), v[j], err_msg=f"row {j} {k}")


def test_validate_clean_and_prepare_skips_the_rewrite(converted, tmp_path):
    res = cli("validate", converted, "--json", "--deep")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["counts"] == {"error": 0, "warning": 0}, doc["findings"]
    root = tmp_path / "p"
    shutil.copytree(converted, root)
    res = cli("prepare", root, "--json", "--world-size", "2", "--workers", "2")
    assert res.returncode == 0, res.stderr
    steps = {s["name"]: s["status"] for s in json.loads(res.stdout)["steps"]}
    assert steps["rowgroups"] == "skipped" and steps["stats"] == "skipped", steps
    # metadata stats refuses v2.1; it works on the converted root
    assert cli("metadata", "stats", V21).returncode != 0
    assert cli("metadata", "stats", root).returncode == 0


def _mtimes(root: Path) -> dict:
    files = [p for p in root.rglob("*") if p.is_file() and "lock" not in p.name]
    return {p: p.stat().st_mtime_ns for p in files}


def test_rerun_is_a_noop_and_stats_computed_once(converted):
    before = _mtimes(converted)
    res = cli("convert", V21, "--out", converted)
    assert res.returncode == 0 and "nothing to do" in res.stdout, res.stdout
    assert before == _mtimes(converted)


def test_complete_source_stats_are_carried_over(tmp_path):
    """A v2.1 source whose episodes_stats.jsonl is complete (here: taken from a conversion)
    keeps those numbers; the converted per-episode stats equal them."""
    src = tmp_path / "v21"
    shutil.copytree(V21, src)
    first = tmp_path / "first"
    assert cli("convert", src, "--out", first).returncode == 0
    eps = pq.read_table(next((first / "meta/episodes").rglob("*.parquet"))).to_pylist()
    lines = []
    for e in eps:
        stats: dict = {}
        for k, v in e.items():
            if k.startswith("stats/"):
                _, feat, stat = (
                    k.rsplit("/", 2) if k.count("/") == 2 else (None, *k[6:].rsplit("/", 1))
                )
                stats.setdefault(feat, {})[stat] = v
        lines.append(json.dumps({"episode_index": e["episode_index"], "stats": stats}))
    (src / "meta/episodes_stats.jsonl").write_text("\n".join(lines) + "\n")
    second = tmp_path / "second"
    res = cli("convert", src, "--out", second, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["stats"] == "carried over"
    again = pq.read_table(next((second / "meta/episodes").rglob("*.parquet"))).to_pylist()
    renumbered = ("stats/index/", "stats/episode_index/", "stats/task_index/")  # the writer's own
    for a, b in zip(eps, again, strict=True):
        for k in a:
            if k.startswith("stats/") and not k.startswith(renumbered):
                assert a[k] == b[k], k


def test_refusals_one_line_and_exit_codes(converted, tmp_path):
    cases = [
        (["convert", converted, "--out", tmp_path / "x"], 2, "already v3.0"),
        (["convert", tmp_path / "missing", "--out", tmp_path / "y"], 2, "no such folder"),
        (["convert", V21, "--out", V21], 2, None),
        (["convert", V21, "--out", tmp_path / "z", "--data-mb", "0"], 2, "--data-mb"),
        (["prepare", V21], 2, "convert it first"),
        (["prepare", V21, "--convert"], 2, "give --out DIR"),
    ]
    for args, code, message in cases:
        res = cli(*args)
        assert res.returncode == code, (args, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) <= 3
        if message:
            assert message in res.stderr, (args, res.stderr)
    assert not (tmp_path / "x").exists() and not (tmp_path / "z").exists()


def test_prepare_convert_into_out(tmp_path):
    out = tmp_path / "ready"
    res = cli("prepare", V21, "--convert", "--out", out, "--world-size", "2", "--workers", "1")
    assert res.returncode == 0, res.stderr
    assert "validation PASSED" in res.stdout
    assert json.loads((out / "meta/info.json").read_text())["codebase_version"] == "v3.0"
    assert (out / "meta/shard_plans/ws2_nw1.json").is_file()


def test_push_to_hub_one_commit_with_every_file(converted):
    from episodekit.writers.convert import push_output

    class FakeApi:
        def __init__(self):
            self.calls = []

        def create_commit(self, **kw):
            self.calls.append(kw)
            return "commit-1"

    api = FakeApi()
    assert push_output(converted, "me/ds", api=api, revision="v3.0") == "commit-1"
    [call] = api.calls
    paths = {op.path_in_repo for op in call["operations"]}
    assert "meta/info.json" in paths and "data/chunk-000/file-000.parquet" in paths
    assert any(p.startswith("videos/") for p in paths)
    assert not any(".episodekit" in p for p in paths) and call["revision"] == "v3.0"


def test_memory_root_converts_the_same(converted, tmp_path):
    """A remote (fsspec) v2.1 root: the same bytes as a local conversion."""
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://v21-{tmp_path.name}"
    for p in V21.rglob("*"):
        if p.is_file():
            fs.pipe(f"{url}/{p.relative_to(V21).as_posix()}", p.read_bytes())
    from episodekit.writers.convert import convert

    out = tmp_path / "remote"
    assert convert(url, out).status == "written"
    for p in converted.rglob("*"):
        if p.is_file() and not p.name.startswith(".episodekit"):
            q = out / p.relative_to(converted)
            assert q.read_bytes() == p.read_bytes(), p.relative_to(converted)


def test_v20_root_without_episode_stats(tmp_path):
    """v2.0: no episodes_stats.jsonl (LeRobot's converter needs v2.1 first); ours computes them."""
    src = tmp_path / "v20"
    shutil.copytree(V21, src)
    (src / "meta/episodes_stats.jsonl").unlink()
    info = json.loads((src / "meta/info.json").read_text())
    (src / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v2.0"}))
    out = tmp_path / "out"
    res = cli("convert", src, "--out", out, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["stats"] == "computed (the source has no per-episode stats)"
    assert rows(out)["action"].equals(rows(V21)["action"])
    assert cli("validate", out).returncode == 0


def test_v21_stats_without_quantiles_carried_or_completed(make_sample, tmp_path):
    """A v2.1 root with the stats v2.1 had (min/max/mean/std/count): carried over as LeRobot's
    converter does (validate: 0 errors, a warning about quantiles); --stats complete computes the
    quantiles (0 warnings)."""
    src = make_sample(episodes=12, seed=4, version="v2.1")
    first = json.loads((src / "meta/episodes_stats.jsonl").read_text().splitlines()[0])
    assert set(first["stats"]["action"]) == {"min", "max", "mean", "std", "count"}
    carried, complete = tmp_path / "carried", tmp_path / "complete"
    res = cli("convert", src, "--out", carried, "--json")
    assert json.loads(res.stdout)["stats"].startswith("carried over (no quantiles")
    eps = pq.read_table(next((carried / "meta/episodes").rglob("*.parquet")))
    assert eps["stats/action/mean"].to_pylist()[0] == pytest.approx(
        first["stats"]["action"]["mean"]
    )
    res = cli("validate", carried, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["counts"]["error"] == 0
    assert {f["check"] for f in doc["findings"]} == {"stats.present"}
    res = cli("convert", src, "--out", complete, "--stats", "complete", "--json")
    assert json.loads(res.stdout)["stats"] == "computed (the source's stats have no quantiles)"
    doc = json.loads(cli("validate", complete, "--json").stdout)
    assert doc["counts"] == {"error": 0, "warning": 0}, doc["findings"]


def test_v21_files_of_several_row_groups_are_read_whole(tmp_path):
    """Local v2.x layouts come from the episodes table, not each footer: a source file split
    into many row groups is still copied whole (and counted against its length)."""
    src = tmp_path / "v21"
    shutil.copytree(V21, src)
    first = sorted((src / "data").rglob("*.parquet"))[0]
    pq.write_table(pq.read_table(first), first, row_group_size=7)
    assert pq.ParquetFile(first).metadata.num_row_groups > 3
    out = tmp_path / "out"
    assert cli("convert", src, "--out", out).returncode == 0
    assert rows(out).equals(rows(V21))


def test_renumbered_columns_quantiles_equal_numpys_without_a_pass(converted, monkeypatch):
    """episode_index, index and task_index are numbered by the writer: their quantiles come
    from the plan in closed form (a v2.x conversion read the whole output once more for them),
    equal to numpy's linear rule over the written column, bit for bit."""
    stats = json.loads((converted / "meta/stats.json").read_text())
    table = rows(converted)
    for name in ("episode_index", "index", "task_index"):
        x = table[name].to_numpy().astype(np.float64)
        want = np.quantile(x, [0.01, 0.10, 0.50, 0.90, 0.99])
        got = [stats[name][k][0] for k in ("q01", "q10", "q50", "q90", "q99")]
        assert got == want.tolist(), name


def test_renumbered_quantiles_match_numpy_on_uneven_episodes_and_tasks():
    from types import SimpleNamespace

    from episodekit.writers.data import TaskValues
    from episodekit.writers.stats_quantiles import renumbered_quantiles

    rng = np.random.default_rng(4)
    length = rng.integers(1, 40, 57)
    tasks = TaskValues()
    ep = np.repeat(np.arange(len(length)), length)
    task = rng.integers(0, 5, len(length))[ep]
    task[3] = 9  # an episode with two tasks: kept as an array piece
    tasks.add(ep, task)
    plan = SimpleNamespace(length=length, from_index=np.cumsum(length) - length)
    got = renumbered_quantiles(plan, tasks)
    qs = [0.01, 0.10, 0.50, 0.90, 0.99]
    for name, x in (("episode_index", ep), ("index", np.arange(len(ep))), ("task_index", task)):
        assert got[name][:, 0].tolist() == np.quantile(x.astype(np.float64), qs).tolist(), name


EP = '{"episode_index": 0, "tasks": ["a"], "length": 3}'


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("episodes.jsonl", EP + '\n{"episode_', "not valid JSON lines"),
        ("episodes.jsonl", '{"episode_index": 0, "tasks": ["a"]}\n', "has no 'length'"),
        ("episodes.jsonl", EP.replace(": 0", ': "x"') + "\n", "not valid JSON lines"),
        ("tasks.jsonl", '{"task_index": 0}\n', "has no 'task'"),
    ],
)  # fmt: skip
def test_bad_v2_jsonl_is_one_line_naming_the_file(tmp_path, name, text, says):
    root = tmp_path / "v21"
    shutil.copytree(V21, root)
    (root / "meta" / name).write_text(text)
    res = cli("convert", root, "--out", tmp_path / "out")
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and name in lines[0], res.stderr
    assert not (tmp_path / "out").exists()
