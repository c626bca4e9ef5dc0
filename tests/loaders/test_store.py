"""The frame store: values, freshness, crashes, its location, and FrameDataset through it."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import episodekit.loaders.store as store_reader
import episodekit.prep.frames as frames_mod
from episodekit.core.dataset import open_dataset
from episodekit.core.errors import DatasetError, EnvironmentProblem
from episodekit.core.store import (
    CACHE_ENV,
    MANIFEST,
    StaleStoreError,
    StoreNotFoundError,
    declared_row_shape,
    default_store_dir,
    read_manifest,
    stale_reasons,
)
from episodekit.loaders import FrameDataset
from episodekit.loaders.reader import column_to_numpy
from episodekit.loaders.store import FrameStore
from episodekit.prep.frames import build_frame_store

FPS = 30
CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]
WINDOWS = {
    "action": [k / FPS for k in range(50)],
    "observation.state": [-2 / FPS, -1 / FPS, 0.0],
}
FIXED = {"action", "observation.state", "timestamp", "frame_index", "episode_index", "index"}
SAMPLES = {
    "recorded": dict(episodes=24, seed=3),
    "edited": dict(episodes=30, seed=4, style="edited", data_files_size_in_mb=0.4),
    "v2.1": dict(episodes=8, seed=5, version="v2.1", mean_length=40),
}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """Every test gets its own cache dir and a fresh warn-once memory."""
    path = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(path))
    monkeypatch.setattr(store_reader, "_warned", set())
    return path


def parquet_columns(root: Path) -> dict[str, np.ndarray]:
    """Every fixed-width feature as the parquet reader decodes it, over all files in order."""
    ds = open_dataset(str(root))
    out = {}
    for name, feat in ds.features.items():
        if feat["dtype"] in ("image", "video", "string"):
            continue
        parts = [
            column_to_numpy(
                pq.read_table(ds.data_path(i), columns=[name]).column(name),
                declared_row_shape(feat),
            )
            for i in range(len(ds.data_files))
        ]
        out[name] = np.concatenate(parts)
    return out


def assert_same(a, b, where=""):
    """Equal values, dtypes, shapes, python types and key order (nested dicts, lists)."""
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
        return
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, list):
        assert a == b, where
        return
    x, y = np.asarray(a), np.asarray(b)
    assert x.dtype == y.dtype and x.shape == y.shape, (where, x.dtype, y.dtype, x.shape, y.shape)
    if x.dtype == object:
        assert all(
            np.array_equal(p, q) if isinstance(p, np.ndarray) else p == q
            for p, q in zip(x.ravel(), y.ravel())
        ), where
    else:
        np.testing.assert_array_equal(x, y, err_msg=where)


# -- values ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_store_values_equal_parquet_for_every_column(make_sample, tmp_path, kind):
    root = make_sample(images=kind != "v2.1", **SAMPLES[kind])
    rep = build_frame_store(root, store=tmp_path / "st")
    assert rep.status == "built"
    ref = parquet_columns(root)
    manifest = read_manifest(tmp_path / "st")
    assert set(manifest["columns"]) == set(ref) and FIXED <= set(ref)  # no images stored
    ds = open_dataset(str(root))
    assert manifest["fingerprint"] == ds.fingerprint
    assert [f["path"] for f in manifest["files"]] == ds.data_files
    for name, c in manifest["columns"].items():
        got = np.load(tmp_path / "st" / c["file"], mmap_mode="r")
        assert got.dtype == ref[name].dtype and got.shape == ref[name].shape, name
        np.testing.assert_array_equal(got, ref[name], err_msg=name)
    bounds = np.load(tmp_path / "st" / manifest["bounds"])
    np.testing.assert_array_equal(bounds[:, 0], ds.column("episode_index"))
    np.testing.assert_array_equal(bounds[:, 2] - bounds[:, 1], ds.column("length"))
    assert not stale_reasons(manifest, ds)


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_framedataset_through_store_equals_parquet(make_sample, kind):
    extra = dict(images=True, videos=1) if kind != "v2.1" else {}
    root = make_sample(**SAMPLES[kind], **extra)
    build_frame_store(root)
    windows = dict(WINDOWS)
    if extra:  # windows on an image and a video key come from parquet / timestamps
        windows["observation.images.wrist"] = [-1 / FPS, 0.0]
        windows["observation.images.cam0"] = [-1 / FPS, 0.0, 1 / FPS]
    for deltas in (windows, {}, {"observation.state": [0.1, -0.5, 2.0], "action": [-3.0]}):
        st = FrameDataset(root, delta_timestamps=deltas, video_backend="paths")
        pq_ds = FrameDataset(root, delta_timestamps=deltas, store=None, video_backend="paths")
        assert st.store is not None and pq_ds.store is None
        n = len(st)
        for i in [0, 1, n - 1, -1, *range(0, n, 37)]:
            assert_same(st[i], pq_ds[i], f"ds[{i}]")
        rng = np.random.default_rng(0)
        for idx in (rng.integers(0, n, 300), np.arange(n), np.array([n - 1]), np.array([], int)):
            assert_same(st.get_batch(idx), pq_ds.get_batch(idx), "get_batch")
        frames = rng.integers(0, n, 50) + int(st.ds.column("dataset_from_index")[0])
        assert_same(st.get_frames(frames), pq_ds.get_frames(frames), "get_frames")


def test_episode_subset_and_windows_at_edges_through_store(make_sample):
    root = make_sample(**SAMPLES["recorded"])
    build_frame_store(root)
    eps = [2, 3, 9, 17]
    st = FrameDataset(root, delta_timestamps=WINDOWS, episodes=eps)
    ref = FrameDataset(root, delta_timestamps=WINDOWS, episodes=eps, store=None)
    assert st.store is not None
    for i in range(len(st)):  # every frame: windows start, end and cross the episode edges
        assert_same(st[i], ref[i], f"ds[{i}]")
    last = st[int(st.episode_starts[1]) - 1]  # last frame of the first episode: all padded
    assert last["action_is_pad"][1:].all() and not last["action_is_pad"][0]
    np.testing.assert_array_equal(last["action"][1:], np.repeat(last["action"][:1], 49, 0))


def test_stream_with_a_store_decodes_nothing(make_sample):
    """ShardedLoader over a root whose store holds every column: the same batches as from
    parquet, and no row group decoded (it used to decode each pool for nothing)."""
    from episodekit.loaders import ShardedLoader
    from episodekit.metadata.plans.build import ensure_plans

    root = make_sample(**SAMPLES["recorded"])
    ensure_plans(str(root), [1], 1)
    kw = dict(rank=0, world_size=1, batch_size=17, speed=False,
              delta_timestamps={"action": [0.0, 1 / 30]})  # fmt: skip
    ref = list(ShardedLoader(root, **kw))
    build_frame_store(root)
    ld = ShardedLoader(root, **kw)
    assert ld.frames.store is not None
    got = list(ld)
    for x, y in zip(got, ref, strict=True):
        for key in ("index", "action", "action_is_pad", "observation.state"):
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)
    assert ld.frames.reader.row_groups_read == 0


def test_pickled_dataset_maps_the_store_again(make_sample):
    root = make_sample(**SAMPLES["recorded"])
    rep = build_frame_store(root)
    st = FrameDataset(root, delta_timestamps=WINDOWS)
    blob = pickle.dumps(st.store)
    assert len(blob) < rep.bytes / 10  # path + manifest, never the arrays
    again = pickle.loads(pickle.dumps(st))
    assert isinstance(again.store, FrameStore)
    col = again.store.columns["action"]
    assert not col.flags.writeable and not col.flags.owndata  # a read-only mapping
    idx = np.arange(0, len(st), 7)
    assert_same(again.get_batch(idx), st.get_batch(idx))


# -- freshness ---------------------------------------------------------------------------------


def test_fresh_store_is_not_rebuilt(make_sample):
    root = make_sample(**SAMPLES["recorded"])
    first = build_frame_store(root)
    mtime = (Path(first.store) / MANIFEST).stat().st_mtime_ns
    second = build_frame_store(root)
    assert second.status == "fresh" and second.store == first.store
    assert (Path(first.store) / MANIFEST).stat().st_mtime_ns == mtime
    assert build_frame_store(root, force=True).status == "built"


def _rewrite_first_file(root: Path, change_value: bool) -> Path:
    ds = open_dataset(str(root))
    path = root / ds.data_files[0]
    st = path.stat()
    table = pq.read_table(path)
    if change_value:
        action = table.column("action").combine_chunks()
        values = action.flatten().to_numpy().copy()
        values[5] += 1.0
        fixed = pa.FixedSizeListArray.from_arrays(pa.array(values), action.type.list_size)
        table = table.set_column(table.schema.get_field_index("action"), "action", fixed)
    pq.write_table(table, path, row_group_size=max(1, table.num_rows // 2))
    if change_value:  # same mtime as before: only the footer hash can tell
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return path


@pytest.mark.parametrize("change_value", [False, True], ids=["rewritten", "value-same-mtime"])
def test_rewritten_data_file_makes_the_store_stale(make_sample, change_value):
    root = make_sample(**SAMPLES["recorded"])
    rep = build_frame_store(root)
    _rewrite_first_file(root, change_value)
    ds = open_dataset(str(root))
    reasons = stale_reasons(read_manifest(rep.store), ds)
    assert reasons and "changed" in reasons[0]
    with pytest.warns(UserWarning, match="stale.*episodekit prep frames"):
        auto = FrameDataset(root, delta_timestamps=WINDOWS)
    assert auto.store is None  # parquet, whose values are the new ones
    if change_value:  # the stale store holds the old value of frame 0, parquet the new one
        old = FrameStore(rep.store).columns["action"][0]
        assert auto[0]["action"][0][5] == old[5] + 1 and (auto[0]["action"][0][:5] == old[:5]).all()
    with pytest.raises(StaleStoreError, match="prep frames"):
        FrameDataset(root, store=rep.store)
    again = build_frame_store(root)
    assert again.status == "built" and "changed" in again.reasons[0]
    fresh = FrameDataset(root, delta_timestamps=WINDOWS)
    assert fresh.store is not None
    assert_same(fresh[5], FrameDataset(root, delta_timestamps=WINDOWS, store=None)[5])


def test_added_episodes_make_the_store_stale(tmp_path):
    from episodekit.sample import write_sample

    root = write_sample(tmp_path / "grow", episodes=10, seed=7)
    rep = build_frame_store(root)
    write_sample(root, episodes=12, seed=7)  # same root, two more episodes
    ds = open_dataset(str(root))
    assert any("fingerprint" in r for r in stale_reasons(read_manifest(rep.store), ds))
    with pytest.warns(UserWarning, match="stale"):
        assert FrameDataset(root).store is None
    assert build_frame_store(root).status == "built"
    assert len(FrameDataset(root)) == ds.num_frames


def test_store_with_other_version_or_features_is_stale(make_sample):
    root = make_sample(**SAMPLES["recorded"])
    rep = build_frame_store(root)
    path = Path(rep.store) / MANIFEST
    doc = json.loads(path.read_text())
    ds = open_dataset(str(root))
    assert stale_reasons({**doc, "version": 999}, ds)
    assert stale_reasons({**doc, "features_digest": "x"}, ds)
    assert stale_reasons({**doc, "files": doc["files"][:-1] + [{"path": "data/other"}]}, ds)
    path.write_text(json.dumps({**doc, "version": 999}))
    with pytest.warns(UserWarning, match="stale.*format version 999"):
        assert FrameDataset(root).store is None
    with pytest.raises(StaleStoreError, match="format version"):
        FrameDataset(root, store=rep.store)
    assert build_frame_store(root).status == "built"


@pytest.mark.parametrize(
    "damage",
    ["truncate-manifest", "manifest-fields", "column-missing", "column-shape"],
)
def test_damaged_store_is_not_used_and_is_rebuilt(make_sample, damage):
    root = make_sample(**SAMPLES["recorded"])
    rep = build_frame_store(root)
    folder = Path(rep.store)
    doc = json.loads((folder / MANIFEST).read_text())
    col = folder / doc["columns"]["action"]["file"]
    if damage == "truncate-manifest":
        (folder / MANIFEST).write_text((folder / MANIFEST).read_text()[:50])
    elif damage == "manifest-fields":
        (folder / MANIFEST).write_text(json.dumps({**doc, "base": "zero", "columns": [1]}))
    elif damage == "column-missing":
        col.unlink()
    else:
        np.save(col, np.zeros((3, 14), np.float32))
    with pytest.warns(UserWarning, match="stale"):
        assert FrameDataset(root).store is None
    assert build_frame_store(root).status == "built"
    assert FrameDataset(root).store is not None


# -- crashes -----------------------------------------------------------------------------------

# Builds ROOT's store but hangs at a chosen point, so a kill -9 lands mid-build.
CHILD = r"""
import sys, time
import episodekit.prep.frames as fr
where = sys.argv[2]
real = getattr(fr, where)
calls = {"n": 0}
def hang(*a, **k):
    calls["n"] += 1
    if calls["n"] == 3 or where == "_verify":
        print("HANG", flush=True)
        time.sleep(600)
    return real(*a, **k)
setattr(fr, where, hang)
fr.build_frame_store(sys.argv[1], jobs=1)
"""


@pytest.mark.parametrize("where", ["_check_structure", "_verify"])
@pytest.mark.parametrize("had_store", [False, True], ids=["first-build", "rebuild"])
def test_kill_mid_build_leaves_no_store_that_would_be_used(make_sample, where, had_store):
    root = make_sample(**SAMPLES["edited"])
    final = default_store_dir(open_dataset(str(root)))
    if had_store:  # an older store, made stale by a rewritten file
        build_frame_store(root)
        _rewrite_first_file(root, change_value=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), where], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "HANG"
        temps = list(final.parent.glob(f".{final.name}.episodekit-partial-*"))
        assert len(temps) == 1 and any(temps[0].glob("*.npy"))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    if had_store:  # the old store is still there, stale: warned about and not used
        assert (final / MANIFEST).exists()
        with pytest.warns(UserWarning, match="stale"):
            assert FrameDataset(root, delta_timestamps=WINDOWS).store is None
    else:
        assert not final.exists()
        assert FrameDataset(root, delta_timestamps=WINDOWS).store is None
    rep = build_frame_store(root)  # the next build cleans up and publishes
    assert rep.status == "built"
    assert not list(final.parent.glob(f".{final.name}.*"))
    assert_same(
        FrameDataset(root, delta_timestamps=WINDOWS).get_batch(np.arange(50)),
        FrameDataset(root, delta_timestamps=WINDOWS, store=None).get_batch(np.arange(50)),
    )


def test_exception_before_publish_leaves_nothing(make_sample, monkeypatch):
    root = make_sample(**SAMPLES["recorded"])
    final = default_store_dir(open_dataset(str(root)))

    def boom(tmp, dest):
        raise RuntimeError("injected")

    monkeypatch.setattr(frames_mod, "publish", boom)
    with pytest.raises(RuntimeError, match="injected"):
        build_frame_store(root)
    assert not final.exists()
    assert not list(final.parent.glob(".*"))  # the temp dir went too
    assert FrameDataset(root).store is None


def test_data_out_of_step_with_episodes_fails_the_build(make_sample, tmp_path):
    root = make_sample(**SAMPLES["recorded"])
    ds = open_dataset(str(root))
    path = root / ds.data_files[0]
    table = pq.read_table(path)
    idx = table.column("index").to_numpy().copy()
    idx[10:] += 1  # a frame missing from the index sequence
    table = table.set_column(table.schema.get_field_index("index"), "index", pa.array(idx))
    pq.write_table(table, path)
    with pytest.raises(DatasetError, match="index is .* episodes table"):
        build_frame_store(root, store=tmp_path / "st")
    assert not (tmp_path / "st").exists() and not list(tmp_path.glob(".st.*"))


def test_rows_with_nulls_fail_the_build(make_sample, tmp_path):
    root = make_sample(**SAMPLES["recorded"])
    ds = open_dataset(str(root))
    path = root / ds.data_files[0]
    table = pq.read_table(path)
    ts = table.column("timestamp").to_pylist()
    ts[3] = None
    table = table.set_column(
        table.schema.get_field_index("timestamp"), "timestamp", pa.array(ts, pa.float32())
    )
    pq.write_table(table, path)
    with pytest.raises(DatasetError, match="timestamp.*null"):
        build_frame_store(root, store=tmp_path / "st")
    assert not (tmp_path / "st").exists()


# -- where the store lives ---------------------------------------------------------------------


def test_default_location_is_the_cache_keyed_by_dataset(make_sample, cache):
    a = make_sample(**SAMPLES["recorded"])
    b = make_sample(**SAMPLES["recorded"])
    before = sorted(p.relative_to(a) for p in a.rglob("*"))
    rep = build_frame_store(a)
    assert Path(rep.store).parent == cache / "frames"
    assert sorted(p.relative_to(a) for p in a.rglob("*")) == before  # root untouched
    assert default_store_dir(open_dataset(str(b))) != Path(rep.store)
    assert FrameDataset(a).store is not None
    assert FrameDataset(b).store is None  # b's data are not a's


def test_missing_cache_dir_reads_parquet_and_is_created_by_the_build(make_sample, cache):
    root = make_sample(**SAMPLES["recorded"])
    assert not cache.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # small data, no store: nothing to warn about
        assert FrameDataset(root).store is None
    build_frame_store(root)
    assert cache.is_dir() and FrameDataset(root).store is not None


def test_unwritable_cache_dir_is_an_environment_problem(make_sample, tmp_path, monkeypatch):
    root = make_sample(**SAMPLES["recorded"])
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))  # cannot be a directory
    with pytest.raises(EnvironmentProblem, match="--store DIR"):
        build_frame_store(root)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert FrameDataset(root).store is None  # the loader just reads parquet, quietly
    out = subprocess.run(
        [*CLI, "prep", "frames", str(root), "-q"],
        capture_output=True,
        text=True,
        env={**os.environ, CACHE_ENV: str(blocker / "cache")},
    )
    assert out.returncode == 2
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "--store DIR" in err[0] and "Traceback" not in out.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_cache_dir(make_sample, cache):
    root = make_sample(**SAMPLES["recorded"])
    build_frame_store(root)
    cache.chmod(0o555)
    (cache / "frames").chmod(0o555)
    try:
        assert FrameDataset(root).store is not None  # reading needs no write access
        with pytest.raises(EnvironmentProblem):
            build_frame_store(root, force=True)
    finally:
        (cache / "frames").chmod(0o755)
        cache.chmod(0o755)


def test_explicit_store_path_must_exist(make_sample, tmp_path):
    root = make_sample(**SAMPLES["recorded"])
    with pytest.raises(StoreNotFoundError):
        FrameDataset(root, store=tmp_path / "nowhere")
    rep = build_frame_store(root, store=tmp_path / "mine")
    assert FrameDataset(root, store=tmp_path / "mine").store.path == Path(rep.store)
    assert FrameDataset(root).store is None  # the default location has none


def test_thrashing_parquet_access_warns_once_naming_the_command(make_sample):
    root = make_sample(**SAMPLES["recorded"])
    from episodekit.loaders import ShardedLoader
    from episodekit.metadata.plans.build import ensure_plans

    ensure_plans(str(root), [1], 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a stream reads each row group once: no warning
        ShardedLoader(root, rank=0, world_size=1, cache_mb=0.05, speed=False)
    with pytest.warns(UserWarning, match=f"episodekit prep frames {root}"):
        FrameDataset(root, cache_mb=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FrameDataset(root, cache_mb=0.05)  # once per process
        FrameDataset(root, cache_mb=0.05, store=None)  # parquet chosen on purpose
    build_frame_store(root)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert FrameDataset(root, cache_mb=0.05).store is not None


# -- command line ------------------------------------------------------------------------------


def test_cli_prep_frames_builds_then_reports_fresh(make_sample, tmp_path):
    root = make_sample(**SAMPLES["recorded"])
    cmd = [*CLI, "prep", "frames", str(root), "-q"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("frame store built:")
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True)
    doc = json.loads(out.stdout)
    assert doc["status"] == "fresh" and FIXED <= set(doc["columns"])
    mine = tmp_path / "explicit"
    out = subprocess.run([*cmd, "--store", str(mine), "--force"], capture_output=True, text=True)
    assert out.returncode == 0 and (mine / MANIFEST).exists()
    out = subprocess.run(
        [*CLI, "prep", "frames", str(tmp_path / "no-root")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "no such folder" in out.stderr  # usage/environment: exit 2


def test_prepare_frames_step_runs_then_skips(make_sample):
    from episodekit.prepare import prepare

    root = make_sample(episodes=20, seed=2, style="edited")
    first = prepare(str(root), world_sizes=[2], num_workers=1, frames=True)
    assert first.ok and first.step("frames").status == "done"
    assert FrameDataset(root).store is not None
    again = prepare(str(root), world_sizes=[2], num_workers=1, frames=True)
    assert again.step("frames").status == "skipped"
    assert prepare(str(root), world_sizes=[2], num_workers=1).step("frames") is None


def test_concurrent_builds_publish_one_complete_store(make_sample):
    root = make_sample(**SAMPLES["edited"])
    code = "import sys; from episodekit.prep.frames import build_frame_store as b; "
    code += "print(b(sys.argv[1], force=True).status)"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE)
        for _ in range(3)
    ]
    for p in procs:
        p.wait(timeout=120)
        assert p.returncode == 0
    final = default_store_dir(open_dataset(str(root)))
    assert not list(final.parent.glob(f".{final.name}.*"))
    st = FrameDataset(root, delta_timestamps=WINDOWS)
    assert st.store is not None
    idx = np.arange(len(st))
    ref = FrameDataset(root, delta_timestamps=WINDOWS, store=None)
    assert_same(st.get_batch(idx), ref.get_batch(idx))


def test_remote_root_gets_a_local_store_keyed_by_its_url(make_sample, cache):
    import fsspec

    root = make_sample(copy=False, episodes=5, tasks=2, seed=9, mean_length=30)
    fs = fsspec.filesystem("memory")
    fs.put(str(root), "/storeremote", recursive=True)
    try:
        url = "memory:///storeremote"
        rep = build_frame_store(url)
        assert Path(rep.store).parent == cache / "frames"
        manifest = read_manifest(rep.store)
        assert manifest["dataset"] == url and manifest["files"][0]["mtime_ns"] is None
        st = FrameDataset(url, delta_timestamps=WINDOWS, speed=False)
        assert st.store is not None and not st.ds.is_local
        ref = FrameDataset(url, delta_timestamps=WINDOWS, speed=False, store=None)
        idx = np.arange(len(st))
        assert_same(st.get_batch(idx), ref.get_batch(idx))
        assert build_frame_store(url).status == "fresh"
    finally:
        fs.rm("/storeremote", recursive=True)


def test_variable_list_columns_with_a_declared_shape_are_stored_when_rows_agree():
    from episodekit.core.store import column_layout
    from episodekit.prep.frames import rows_of

    feat = {"dtype": "float32", "shape": [3]}
    t = pa.list_(pa.float32())  # what older HF `datasets` writers produce for a Sequence
    assert column_layout(t, feat) == (np.dtype("float32"), (3,))
    assert column_layout(t, {"dtype": "float32"}) is None  # no declared width: not storable
    assert column_layout(pa.string(), {"dtype": "string"}) is None
    assert column_layout(pa.list_(pa.string()), {"dtype": "float32", "shape": [2]}) is None
    assert column_layout(pa.list_(pa.int16(), 4), {"dtype": "int16", "shape": [4]}) == (
        np.dtype("int16"),
        (4,),
    )
    assert column_layout(pa.list_(pa.float64(), 4), {"dtype": "float64", "shape": [2, 2]}) == (
        np.dtype("float64"),
        (2, 2),
    )
    good = pa.array([[1, 2, 3], [4, 5, 6]], t)
    np.testing.assert_array_equal(rows_of(good, np.dtype("float32"), (3,)), [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(rows_of(good.slice(1), np.dtype("float32"), (3,)), [[4, 5, 6]])
    with pytest.raises(ValueError, match="unequal"):
        rows_of(pa.array([[1, 2, 3], [4, 5]], t), np.dtype("float32"), (3,))
    with pytest.raises(ValueError, match="null"):
        rows_of(pa.array([[1, 2, 3], None], t), np.dtype("float32"), (3,))
    with pytest.raises(ValueError, match="null"):
        rows_of(pa.array([[1, None, 3]], t), np.dtype("float32"), (3,))
