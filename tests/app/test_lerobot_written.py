"""Datasets LeRobot 0.4.4 wrote itself (tests/fixtures/lerobot, see its README): every command as
a user runs it (a subprocess on a copy), and the loaders against LeRobot's own samples
(``ref/*.npz``) before and after ``prepare``.

Copies are module-scoped: one untouched copy and one prepared copy per dataset, shared by the
tests that only read them; commands that write get a fresh copy each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from episodekit.core.store import CACHE_ENV

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
NAMES = ["rec40", "edited35", "vid24"]
NUMERIC = ["rec40", "edited35"]
CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]
REF_SKIP = {"delta", "notes", "raw_rows", "raw_float_top", "raw_float_wrist"}
WS, NW = 2, 2  # the shard plans the loaders read: 4 bins


def have_av() -> bool:
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def needs(name: str) -> None:
    if name == "vid24" and not have_av():
        pytest.skip("PyAV is not installed (pip install 'episodekit[video]')")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """One frame-store cache for the module (subprocesses and this process)."""
    path = tmp_path_factory.mktemp("cache")
    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(path)
    yield path
    if old is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = old


def run(*args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    """One CLI call as a subprocess: its exit code must be one of ``ok``, no traceback."""
    r = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert r.returncode in ok, (
        f"{args}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    )
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-2000:]
    return r


def run_json(*args: str, ok: tuple[int, ...] = (0,)) -> dict:
    r = run(*args, "--json", ok=ok)
    return json.loads(r.stdout)


def copy_of(name: str, dst: Path) -> Path:
    shutil.copytree(FIXTURES / name, dst)
    return dst


def ref_of(name: str) -> dict[str, np.ndarray]:
    z = np.load(FIXTURES / "ref" / f"{name}_ref.npz")
    return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def untouched(tmp_path_factory, cache_dir) -> dict[str, Path]:
    """A copy of each dataset nothing writes into (read-only commands, loaders before prepare)."""
    base = tmp_path_factory.mktemp("untouched")
    return {n: copy_of(n, base / n) for n in NAMES}


def _stats_state(root: Path) -> tuple[bytes, dict]:
    """meta/stats.json's bytes and the per-episode stats/* columns."""
    eps = sorted((root / "meta" / "episodes").rglob("*.parquet"))
    cols = {}
    for f in eps:
        t = pq.read_table(f)
        for c in t.column_names:
            if c.startswith("stats/"):
                cols.setdefault(c, []).extend(t[c].to_pylist())
    return (root / "meta" / "stats.json").read_bytes(), cols


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, cache_dir) -> dict[str, dict]:
    """Each dataset after a default ``prepare`` (twice), then plans for WS x NW and a frame
    store: ``{name: {"root", "first", "second", "stats_before", "stats_after"}}``."""
    base = tmp_path_factory.mktemp("prepared")
    out = {}
    for n in NAMES:
        if n == "vid24" and not have_av():
            continue
        root = copy_of(n, base / n)
        before = _stats_state(root)
        first = run_json("prepare", root, "-j", "1")
        after = _stats_state(root)
        second = run_json("prepare", root, "-j", "1")
        run("metadata", "plan", root, "--world-size", WS, "--workers", NW)
        run("prep", "frames", root, "-j", "1")
        out[n] = dict(root=root, first=first, second=second, stats_before=before, stats_after=after)
    return out


# --------------------------------------------------------------------------------------------
# validate and info on what LeRobot wrote


@pytest.mark.parametrize("name", NAMES)
def test_validate_passes_what_lerobot_wrote(untouched, name, tmp_path):
    root = untouched[name]
    r = run("validate", root)
    assert "OK: 0 errors" in r.stdout
    report = tmp_path / "r.md"
    doc = run_json("validate", root, "--report", report)
    assert doc["exit_code"] == 0 and doc["counts"]["error"] == 0
    assert report.read_text().strip()
    # warnings only for what `prepare` fixes (row groups, page index)
    assert {f["check"] for f in doc["findings"]} <= {"layout.row_groups", "layout.page_index"}
    assert not [f for f in doc["findings"] if f["check"].startswith(("stats.", "quality."))]


@pytest.mark.parametrize("name", NAMES)
def test_validate_deep_and_fail_on(untouched, name):
    needs(name)
    root = untouched[name]
    doc = run_json("validate", root, "--deep")
    assert doc["exit_code"] == 0, [f for f in doc["findings"] if f["severity"] == "error"]
    # no quality finding on these: --fail-on warning only trips on the layout warnings,
    # which a prepared copy no longer has (see test_prepare_then_validate)
    doc = run_json("validate", root, "--fail-on", "warning", "--checks", "quality", ok=(0,))
    assert doc["findings"] == []


@pytest.mark.parametrize("name", NAMES)
def test_info(untouched, name):
    root = untouched[name]
    run("info", root)
    doc = run_json("info", root)
    meta = json.loads((root / "meta" / "info.json").read_text())
    text = json.dumps(doc)
    assert str(meta["total_frames"]) in text and str(meta["total_episodes"]) in text


# --------------------------------------------------------------------------------------------
# prepare: twice, the second does nothing; validate after it


@pytest.mark.parametrize("name", NAMES)
def test_prepare_twice_second_all_skipped(prepared, name):
    needs(name)
    p = prepared[name]
    assert p["first"]["ok"] and p["second"]["ok"]
    assert {s["name"] for s in p["first"]["steps"]} >= {"rowgroups", "stats", "validate"}
    assert {s["status"] for s in p["second"]["steps"]} == {"skipped"}, p["second"]["steps"]


@pytest.mark.parametrize("name", NAMES)
def test_prepare_then_validate(prepared, name):
    needs(name)
    root = prepared[name]["root"]
    doc = run_json("validate", root)
    assert doc["exit_code"] == 0 and doc["counts"] == {"error": 0, "warning": 0}, doc["findings"]
    run("validate", root, "--fail-on", "warning")


@pytest.mark.parametrize("name", NAMES)
def test_prepare_keeps_lerobot_stats_byte_identical(prepared, name):
    needs(name)
    p = prepared[name]
    assert p["stats_after"][0] == p["stats_before"][0]  # meta/stats.json, byte for byte
    assert p["stats_after"][1] == p["stats_before"][1]  # every per-episode stats/* value


# --------------------------------------------------------------------------------------------
# each command alone, on a fresh copy


@pytest.mark.parametrize("name", NAMES)
def test_prep_and_metadata_commands(name, tmp_path, cache_dir):
    needs(name)
    root = copy_of(name, tmp_path / name)
    doc = run_json("prep", "rowgroups", root, "-j", "1")
    assert json.dumps(doc)
    assert run_json("prep", "rowgroups", root, "-j", "1")["counts"]["rewritten"] == 0
    run_json("prep", "frames", root, "-j", "1")
    run_json("metadata", "speed", root)
    run("metadata", "costs", root)
    run_json("metadata", "plan", root, "--world-size", "2", "--workers", "2")
    plan = run_json("metadata", "plan", root, "--world-size", "2", "--canonical-bins", "auto")
    assert "canonical" in json.dumps(plan)
    images = ["--images"] if name == "vid24" else []
    run_json("metadata", "stats", root, *images)
    assert run("validate", root).returncode == 0


def test_prep_videos_on_lerobot_av1(tmp_path, cache_dir):
    needs("vid24")
    root = copy_of("vid24", tmp_path / "vid24")
    # LeRobot's AV1 (a keyframe every 2 frames, one at every episode start) meets the target:
    # left as it is (a re-encode would only lose quality; tests/prep/test_video_target.py).
    before = {p: p.read_bytes() for p in root.glob("videos/*/*/*.mp4")}
    doc = run_json("prep", "videos", root, "--gop", "8")
    assert {f["status"] for f in doc["files"]} == {"skipped"} and len(doc["files"]) == 4
    assert {p: p.read_bytes() for p in root.glob("videos/*/*/*.mp4")} == before
    run("validate", root)


def test_mixture_of_two_lerobot_datasets(untouched, tmp_path):
    a = copy_of("rec40", tmp_path / "a")
    b = copy_of("edited35", tmp_path / "b")
    spec = tmp_path / "m.json"
    spec.write_text(
        json.dumps({"sources": [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 2}]})
    )
    doc = run_json("info", "--mixture", spec)
    assert len(doc["sources"]) == 2
    out = tmp_path / "plans"
    run_json(
        "metadata", "plan", "--mixture", spec, "--world-size", "2", "--workers", "1", "--out", out
    )
    assert (out / "mixture.json").exists()
    run_json("metadata", "stats", "--mixture", spec, "--out", tmp_path / "st")
    from episodekit.loaders import ShardedLoader

    ld = ShardedLoader(out, None, rank=0, world_size=2, num_workers=1, batch_size=64, speed=False)
    got = sum(len(batch["action"]) for batch in ld)
    assert got == ld.samples_per_worker * ld.num_workers > 0


# --------------------------------------------------------------------------------------------
# loader parity against LeRobot's own samples


def assert_sample_equals(sample: dict, ref: dict, j: int, name: str) -> None:
    for k, v in ref.items():
        if k in REF_SKIP:
            continue
        if k == "task":
            assert sample["task"] == str(v[j]), (name, j, k)
            continue
        got = np.asarray(sample[k])
        assert got.shape == v[j].shape and got.dtype.kind == v[j].dtype.kind, (name, j, k)
        np.testing.assert_array_equal(got, v[j], err_msg=f"{name} row {j} {k}")


def frame_parity(root: Path, name: str, store: str | None):
    """FrameDataset on ``root`` (``store``: None parquet only, "auto" the frame store) gives
    LeRobot's sample at every reference index, one by one and as a batch."""
    from episodekit.loaders import FrameDataset

    ref = ref_of(name)
    delta = json.loads(str(ref["delta"]))
    video = {"video_backend": "pyav"} if name == "vid24" else {}
    fds = FrameDataset(root, delta_timestamps=delta, speed=False, store=store, **video)
    for j, g in enumerate(ref["index"]):
        assert_sample_equals(fds[int(g)], ref, j, name)
    # the same rows as one batch
    batch = fds.get_batch(ref["index"][:32])
    for k in ("action", "action_is_pad"):
        np.testing.assert_array_equal(batch[k], ref[k][:32])
    return fds


@pytest.mark.parametrize("name", NAMES)
def test_frames_equal_lerobot_before_prepare(untouched, name):
    needs(name)
    fds = frame_parity(untouched[name], name, None)
    assert fds.store is None


@pytest.mark.parametrize("name", NUMERIC)
def test_frames_equal_lerobot_before_prepare_through_store(name, tmp_path, cache_dir):
    """A frame store of the untouched parquet (prep frames writes outside the root)."""
    root = copy_of(name, tmp_path / name)
    run("prep", "frames", root, "-j", "1")
    assert frame_parity(root, name, "auto").store is not None


@pytest.mark.parametrize("name", NAMES)
def test_frames_equal_lerobot_after_prepare_with_and_without_store(prepared, name):
    needs(name)
    root = prepared[name]["root"]
    assert frame_parity(root, name, None).store is None
    assert frame_parity(root, name, "auto").store is not None


@pytest.mark.parametrize("name", NAMES)
def test_sharded_loader_every_bin_equals_lerobot(prepared, name):
    """Every bin of the WS x NW plan streamed: each reference index found carries LeRobot's
    sample; every bin yields its planned count and the bins cover the reference indices."""
    needs(name)
    from episodekit.loaders import ShardedLoader
    from episodekit.metadata.plans.load import load_plan

    root = prepared[name]["root"]
    ref = ref_of(name)
    delta = json.loads(str(ref["delta"]))
    pos = {int(g): j for j, g in enumerate(ref["index"])}
    plan = load_plan(str(root), WS, NW)
    video = {"video_backend": "pyav"} if name == "vid24" else {}
    seen: set[int] = set()
    for rank in range(WS):
        for w in range(NW):
            ld = ShardedLoader(
                root, plan, rank=rank, world_size=WS, worker=w, batch_size=128,
                delta_timestamps=delta, speed=False, **video,
            )  # fmt: skip
            n = 0
            for batch in ld:
                idx = np.asarray(batch["index"])
                n += len(idx)
                for r in np.flatnonzero(np.isin(idx, list(pos))):
                    g = int(idx[r])
                    seen.add(g)
                    sample = {k: v[r] for k, v in batch.items()}
                    assert_sample_equals(sample, ref, pos[g], name)
            assert n == plan.samples_per_worker
    # trim may drop a few frames of the heaviest bins; nearly every reference index is streamed
    assert len(seen) >= 0.9 * len(pos), (len(seen), len(pos))


def test_video_pads_repeat_the_episode_first_frame(untouched):
    """vid24: padded top slots equal the episode's first frame (LeRobot), pixel for pixel."""
    needs("vid24")
    ref = ref_of("vid24")
    pads = ref["observation.images.top_is_pad"]
    assert pads[:, 0].any() and not pads[:, 1].any()
    rows = np.flatnonzero(pads[:, 0])
    np.testing.assert_array_equal(
        ref["observation.images.top"][rows, 0], ref["observation.images.top"][rows, 1]
    )  # the reference itself: a first frame's [-1] slot repeats it
    from episodekit.loaders import FrameDataset

    fds = FrameDataset(
        untouched["vid24"], delta_timestamps=json.loads(str(ref["delta"])), speed=False,
        video_backend="pyav",
    )  # fmt: skip
    for j in rows:
        s = fds[int(ref["index"][j])]
        np.testing.assert_array_equal(s["observation.images.top_is_pad"], pads[j])
        np.testing.assert_array_equal(s["observation.images.top"], ref["observation.images.top"][j])
