"""The rosbag reader against bags rosbags' own writers made (tests/fixtures/import/rosbag_*:
generator, versions), its values checked against rosbags' own reading of the same bags put
through the stated rule by a plain loop here; and ``episodekit import`` as a user runs it."""

from __future__ import annotations

import bisect
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

rosbags = pytest.importorskip("rosbags")
pytest.importorskip("PIL")

from rosbags.highlevel import AnyReader  # noqa: E402
from rosbags.typesys import Stores, get_typestore  # noqa: E402

from episodekit.importers.episode import MissingExtra, SourceError  # noqa: E402
from episodekit.importers.mapping import MapError, Skip, apply_map, parse_map  # noqa: E402
from episodekit.importers.rosbag import RosbagReader  # noqa: E402
from tests.app.hostile import cli as ek  # noqa: E402
from tests.importers.outputs import column, data  # noqa: E402

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "import"
FORMATS = ["rosbag_mcap", "rosbag_sqlite3", "rosbag_ros1"]
JOINTS = ("shoulder_pan", "shoulder_lift", "elbow", "wrist_1", "wrist_2", "gripper")
TOPICS = ["/camera/image_raw", "/cmd", "/joint_states", "/task", "/wrist/image/compressed"]
FPS = 10


def bag_path(fmt: str, ep: int) -> Path:
    return FIX / fmt / (f"episode_{ep}.bag" if fmt == "rosbag_ros1" else f"episode_{ep}")


def expected(
    path: Path, fps: float = FPS, latched: tuple[str, ...] = (), within: tuple = (0, 2**63)
) -> dict:
    """What the rule gives, from rosbags' own reading: the grid from the latest first message
    to the earliest last one (of the topics not ``latched``), every 1/fps s; per tick and topic
    the latest message at or before it (a plain bisect loop, not the reader's searchsorted);
    only messages received ``within`` [from, to) count."""
    msgs: dict[str, list] = {}
    with AnyReader([path], default_typestore=get_typestore(Stores.ROS2_HUMBLE)) as r:
        for c, t, raw in r.messages():
            if within[0] <= t < within[1] and c.topic != "/episode_start":
                msgs.setdefault(c.topic, []).append((t, r.deserialize(raw, c.msgtype)))
    start = max(m[0][0] for m in msgs.values())
    end = min(m[-1][0] for t, m in msgs.items() if t not in latched)
    ticks = []
    k = 0
    while start + round(k * 1e9 / fps) <= end:
        ticks.append(start + round(k * 1e9 / fps))
        k += 1
    out: dict = {"ticks": ticks, "start": start}
    for topic, ms in msgs.items():
        times = [t for t, _ in ms]
        out[topic] = [ms[bisect.bisect_right(times, tick) - 1][1] for tick in ticks]
        out[topic + "#age"] = [tick - times[bisect.bisect_right(times, tick) - 1] for tick in ticks]
    return out


@pytest.fixture(scope="module")
def readers() -> dict[str, RosbagReader]:
    out = {}
    for fmt in FORMATS:
        r = RosbagReader(FIX / fmt)
        r.rate = FPS
        out[fmt] = r
    return out


def test_detect_bags_folders_of_bags_and_nothing_else(tmp_path: Path) -> None:
    for fmt in FORMATS:
        assert RosbagReader.detect(FIX / fmt) and RosbagReader.detect(bag_path(fmt, 0))
    assert RosbagReader.detect(bag_path("rosbag_mcap", 0) / "episode_0.mcap")
    assert not RosbagReader.detect(FIX / "aloha_raw")
    assert not RosbagReader.detect(FIX / "robomimic.hdf5")
    (tmp_path / "x.bag").write_bytes(b"#ROSBAG V1.2\n")
    (tmp_path / "y.mcap").write_bytes(b"not an mcap")
    assert not RosbagReader.detect(tmp_path)
    code = (
        "import sys; from pathlib import Path; from episodekit.importers.registry import detect;"
        f"print(detect(Path({str(FIX / 'rosbag_ros1')!r})).format,"
        " any(m.startswith('rosbags') for m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.split() == ["rosbag", "False"], r.stderr  # detection imports no rosbags


@pytest.mark.parametrize("fmt", FORMATS)
def test_keys_carry_joint_names_and_image_encodings(readers, fmt) -> None:
    keys = readers[fmt].keys()
    assert sorted(keys) == sorted([
        "/camera/image_raw", "/cmd", "/joint_states.effort", "/joint_states.position",
        "/joint_states.velocity", "/task", "/wrist/image/compressed",
    ])  # fmt: skip
    for f in ("position", "velocity", "effort"):
        k = keys[f"/joint_states.{f}"]
        assert (k.kind, k.dtype, k.shape, k.names) == ("array", "float64", (6,), JOINTS)
    assert (keys["/cmd"].dtype, keys["/cmd"].shape) == ("float32", (7,))
    assert (keys["/camera/image_raw"].encoding, keys["/camera/image_raw"].shape) == (
        "raw", (24, 32, 3))  # fmt: skip
    assert keys["/wrist/image/compressed"].encoding == "jpeg"
    assert keys["/task"].kind == "text"
    assert readers[fmt].episodes() == (
        ["episode_0.bag", "episode_1.bag"] if fmt == "rosbag_ros1" else ["episode_0", "episode_1"]
    )


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("ep", [0, 1])
def test_resampled_values_follow_the_rule(readers, fmt, ep) -> None:
    r = readers[fmt]
    raw = r.read(r.episodes()[ep])
    want = expected(bag_path(fmt, ep))
    n = len(want["ticks"])
    assert raw.length == n and n >= 14
    np.testing.assert_array_equal(raw.timestamps, (np.asarray(want["ticks"]) - want["start"]) / 1e9)
    for f in ("position", "velocity", "effort"):
        got = raw.arrays[f"/joint_states.{f}"]
        assert got.dtype == np.float64
        assert got.tobytes() == np.stack([getattr(m, f) for m in want["/joint_states"]]).tobytes()
    assert raw.arrays["/cmd"].tobytes() == np.stack([m.data for m in want["/cmd"]]).tobytes()
    assert raw.texts["/task"] == [m.data for m in want["/task"]]
    cams = np.stack(list(raw.images["/camera/image_raw"].frames()))
    assert cams.tobytes() == b"".join(bytes(m.data) for m in want["/camera/image_raw"])
    blobs = raw.images["/wrist/image/compressed"].encoded()
    assert list(blobs) == [bytes(m.data) for m in want["/wrist/image/compressed"]]
    # the fixture's streams start at different times, so the grid starts at the latest first
    assert want["start"] > min(int(ts) for ts in want["ticks"]) - 1
    if ep == 0:
        assert len(set(raw.texts["/task"])) == 2  # the instruction changes in bag 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_report_has_latency_drops_and_staleness_per_topic(readers, fmt) -> None:
    raw = readers[fmt].read(readers[fmt].episodes()[0])
    want = expected(bag_path(fmt, 0))
    rep = raw.report["topics"]
    assert sorted(rep) == TOPICS and raw.report["missing"] == []
    js = rep["/joint_states"]
    assert 2.0 <= js["latency_ms"]["mean"] <= js["latency_ms"]["max"] <= 6.0  # stamps 2-6 ms
    assert rep["/camera/image_raw"]["latency_ms"] == {"mean": 10.0, "max": 10.0}
    assert rep["/cmd"]["latency_ms"] is None  # no header
    for topic in TOPICS:
        assert rep[topic]["dropped"] == (0 if topic == "/task" else 1)  # one gap per stream
        ages = np.asarray(want[topic + "#age"]) / 1e6
        assert rep[topic]["staleness_ms"]["max"] == round(float(ages.max()), 3)
    assert rep["/task"]["repeated"] >= 10 and rep["/joint_states"]["repeated"] == 0
    assert 49 < js["rate_hz"] < 51


def test_max_staleness_refuses_one_line_or_skips(readers) -> None:
    topics = ["/camera/image_raw", "/joint_states"]  # 15 Hz: a take up to 72 ms old in bag 0
    r = RosbagReader(FIX / "rosbag_mcap", {"topics": topics, "max_staleness": 0.06})
    r.rate = FPS
    with pytest.raises(SourceError) as e:
        r.read("episode_0")
    msg = str(e.value)
    assert "\n" not in msg and "/camera/image_raw" in msg and "over max_staleness 0.06 s" in msg
    assert "episode_0" in msg and "t = " in msg
    r.options["stale"] = "skip"
    with pytest.raises(Skip):
        r.read("episode_0")
    r.options = {"topics": topics, "max_staleness": 0.12}  # the oldest take: 102 ms
    assert r.read("episode_0").length > 0


def test_bad_source_options_are_map_errors() -> None:
    r = RosbagReader(FIX / "rosbag_mcap", {"max_stale": 1})
    r.rate = FPS
    with pytest.raises(MapError, match="unknown key 'max_stale'"):
        r.read("episode_0")
    r.options = {"stale": "drop"}
    with pytest.raises(MapError, match="stale"):
        r.read("episode_0")


def test_topics_option_bounds_the_grid(readers) -> None:
    r = RosbagReader(FIX / "rosbag_mcap", {"topics": ["/joint_states"]})
    r.rate = FPS
    raw = r.read("episode_0")
    assert sorted(raw.arrays) == ["/joint_states.effort", "/joint_states.position",
                                  "/joint_states.velocity"]  # fmt: skip
    assert raw.length > readers["rosbag_mcap"].read("episode_0").length  # joint_states alone


def test_default_map_parses_and_maps(readers) -> None:
    r = readers["rosbag_sqlite3"]
    doc = r.default_map()
    assert doc["source"] == {"topics": TOPICS, "latched": ["/task"]}
    assert doc["task"] == {"key": "/task"}
    assert doc["features"]["observation.state"]["names"] == list(JOINTS)
    assert doc["features"]["action"] == {"keys": ["/cmd"]}
    m = parse_map(doc, r.keys())
    mapped = apply_map(r.read("episode_1"), m, r.keys())
    assert mapped.columns["observation.state"].shape == (mapped.length, 6)
    assert set(mapped.images) == {"observation.images.camera", "observation.images.wrist"}


def test_reader_pickles_with_its_rate() -> None:
    r = RosbagReader(FIX / "rosbag_ros1", {"topics": ["/cmd"]})
    r.rate = 5.0
    r2 = pickle.loads(pickle.dumps(r))
    assert r2.rate == 5.0 and r2.read("episode_1.bag").length > 0


def test_missing_rosbags_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rosbags.highlevel", None)
    with pytest.raises(MissingExtra, match=r"episodekit\[rosbag\]"):
        RosbagReader(FIX / "rosbag_mcap").keys()


# --------------------------------------------------------------------------------------------
# The CLI


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    base = tmp_path_factory.mktemp("ros")
    out = {}
    for fmt in FORMATS:
        r = ek("import", str(FIX / fmt), "--out", str(base / fmt), "--fps", str(FPS), "--json")
        assert r.returncode == 0, r.stderr
        out[fmt] = (base / fmt, json.loads(r.stdout))
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_import_validates_deep_with_the_rules_values(imported, fmt) -> None:
    root, result = imported[fmt]
    v = ek("validate", "--deep", str(root))
    assert v.returncode == 0, v.stdout + v.stderr
    info = json.loads((root / "meta/info.json").read_text())
    assert info["fps"] == FPS and info["total_episodes"] == 2
    assert info["features"]["observation.state"]["names"] == list(JOINTS)
    t = data(root)
    ep = column(t, "episode_index")
    for e in range(2):
        want = expected(bag_path(fmt, e), latched=("/task",))  # the built-in map latches it
        rows = ep == e
        state = np.stack([m.position for m in want["/joint_states"]])
        assert column(t, "observation.state")[rows].tobytes() == state.tobytes()
        action = np.stack([m.data for m in want["/cmd"]])
        assert column(t, "action")[rows].tobytes() == action.tobytes()
        fi = column(t, "frame_index")[rows]
        assert np.array_equal(fi, np.arange(len(want["ticks"])))
        assert column(t, "timestamp")[rows].tobytes() == (fi / FPS).astype(np.float32).tobytes()
    assert info["total_tasks"] == 2
    rep = result["reports"]
    assert sorted(rep) == sorted(RosbagReader(FIX / fmt).episodes())
    assert all(sorted(x["topics"]) == TOPICS for x in rep.values())


def test_print_map_round_trips_and_a_map_fps_is_used(tmp_path: Path, imported) -> None:
    import tomllib

    r = ek("import", str(FIX / "rosbag_ros1"), "--print-map")
    assert r.returncode == 0, r.stderr
    assert tomllib.loads(r.stdout) == RosbagReader(FIX / "rosbag_ros1").default_map()
    m = tmp_path / "map.toml"
    m.write_text(f"fps = {FPS}\n" + r.stdout)
    out = tmp_path / "out"
    r = ek("import", str(FIX / "rosbag_ros1"), "--out", str(out), "--map", str(m))
    assert r.returncode == 0, r.stderr
    assert data(out).equals(data(imported["rosbag_ros1"][0]))


def test_a_truncated_bag_is_one_line_and_publishes_nothing(tmp_path: Path) -> None:
    for fmt in FORMATS:
        src = tmp_path / fmt
        shutil.copytree(FIX / fmt, src)
        bag = src / bag_path(fmt, 1).name
        f = next(bag.glob("*.*3")) if fmt == "rosbag_sqlite3" else (
            next(bag.glob("*.mcap")) if bag.is_dir() else bag)  # fmt: skip
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        out = tmp_path / f"out_{fmt}"
        r = ek("import", str(src), "--out", str(out), "--fps", str(FPS))
        assert r.returncode == 1, (fmt, r.stderr)
        errors = [line for line in r.stderr.splitlines() if line.startswith("Error")]
        assert len(errors) == 1 and str(bag) in errors[0], (fmt, r.stderr)
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FORMATS)  # no staging left


def _copy_without(
    src: Path, dest: Path, drop: str, keep_first: str = "", marks: tuple[int, ...] = ()
) -> None:
    """A ROS 2 MCAP bag rewritten by rosbags' own writer without topic ``drop``, with only
    the first message of topic ``keep_first``, and ``/episode_start`` messages at ``marks``
    (ns after the bag's first message)."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    store = get_typestore(Stores.ROS2_HUMBLE)
    with AnyReader([src], default_typestore=store) as r, Writer(
        dest, version=9, storage_plugin=StoragePlugin.MCAP
    ) as w:  # fmt: skip
        conns = {}
        if marks:
            mc = w.add_connection("/episode_start", "std_msgs/msg/String", typestore=store)
            for m in marks:
                msg = store.types["std_msgs/msg/String"](data="start")
                w.write(mc, r.start_time + m, store.serialize_cdr(msg, "std_msgs/msg/String"))
        for c, t, raw in r.messages():
            if c.topic == drop or (c.topic == keep_first and c.topic in conns):
                continue
            if c.topic not in conns:
                conns[c.topic] = w.add_connection(c.topic, c.msgtype, typestore=store)
            w.write(conns[c.topic], t, raw)


def test_a_topic_missing_from_a_bag_is_one_line(tmp_path: Path) -> None:
    src = tmp_path / "bags"
    src.mkdir()
    shutil.copytree(bag_path("rosbag_mcap", 0), src / "episode_0")
    _copy_without(bag_path("rosbag_mcap", 1), src / "episode_1", "/cmd")
    out = tmp_path / "out"
    r = ek("import", str(src), "--out", str(out), "--fps", str(FPS))
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, r.stderr
    assert str(src / "episode_1") in errors[0] and "'/cmd'" in errors[0] and "missing" in errors[0]
    assert not out.exists()


def test_a_latched_topic_does_not_end_the_grid(tmp_path: Path) -> None:
    """A task published once at the start: without ``latched`` the grid ends at its only
    message (one frame); latched, it runs to the other topics' end with that task."""
    bag = tmp_path / "episode_0"
    _copy_without(bag_path("rosbag_mcap", 0), bag, "", keep_first="/task")
    topics = ["/joint_states", "/task"]
    r = RosbagReader(bag, {"topics": topics})
    r.rate = FPS
    assert r.read("episode_0").length == 1
    r.options = {"topics": topics, "latched": ["/task"]}
    raw = r.read("episode_0")
    with AnyReader([bag], default_typestore=get_typestore(Stores.ROS2_HUMBLE)) as rd:
        times = {t: [s for _, s, _ in rd.messages([c for c in rd.connections if c.topic == t])]
                 for t in topics}  # fmt: skip
    task_t, joints_end = times["/task"][0], times["/joint_states"][-1]
    assert len(times["/task"]) == 1 and task_t > times["/joint_states"][0]
    assert raw.report["grid"]["start_ns"] == task_t
    assert raw.report["grid"]["end_ns"] == joints_end
    assert raw.length == (joints_end - task_t) // (10**9 // FPS) + 1
    assert set(raw.texts["/task"]) == {"pick up the red cube"}


def test_bgr8_images_and_png_compressed_images(tmp_path: Path) -> None:
    """A bag (rosbags' writer, in the test) with a bgr8 Image and a PNG CompressedImage: the
    built-in map says channels = "bgr" for it, frames come back as the bag stores them, PNG
    bytes are kept and decode to what was encoded."""
    import io

    from PIL import Image
    from rosbags.rosbag2 import StoragePlugin, Writer

    store = get_typestore(Stores.ROS2_HUMBLE)
    T = store.types
    rng = np.random.default_rng(7)
    bgr = rng.integers(0, 255, (6, 4, 5, 3), dtype=np.uint8)
    pngs = []
    for img in bgr:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "PNG")
        pngs.append(buf.getvalue())
    bag = tmp_path / "bgr"
    with Writer(bag, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        ci = w.add_connection("/cam/image_raw", "sensor_msgs/msg/Image", typestore=store)
        cp = w.add_connection("/depth/compressed", "sensor_msgs/msg/CompressedImage",
                              typestore=store)  # fmt: skip
        for k in range(6):
            t = 10**9 + k * 100_000_000
            hdr = T["std_msgs/msg/Header"](
                stamp=T["builtin_interfaces/msg/Time"](sec=1, nanosec=k * 100_000_000),
                frame_id="c",
            )
            # a row step of 16 bytes: one byte of padding per row
            img = T["sensor_msgs/msg/Image"](
                header=hdr, height=4, width=5, encoding="bgr8", is_bigendian=0, step=16,
                data=np.pad(bgr[k].reshape(4, 15), ((0, 0), (0, 1))).reshape(-1),
            )  # fmt: skip
            w.write(ci, t, store.serialize_cdr(img, "sensor_msgs/msg/Image"))
            png = T["sensor_msgs/msg/CompressedImage"](
                header=hdr, format="png", data=np.frombuffer(pngs[k], np.uint8)
            )
            w.write(cp, t, store.serialize_cdr(png, "sensor_msgs/msg/CompressedImage"))
    r = RosbagReader(bag)
    r.rate = FPS
    keys = r.keys()
    assert keys["/depth/compressed"].encoding == "png" and keys["/cam/image_raw"].shape == (4, 5, 3)
    feats = r.default_map()["features"]
    assert feats["observation.images.cam"] == {"keys": ["/cam/image_raw"], "channels": "bgr"}
    assert feats["observation.images.depth"] == {"keys": ["/depth/compressed"]}
    raw = r.read("bgr")
    assert raw.length == 6
    assert np.stack(list(raw.images["/cam/image_raw"].frames())).tobytes() == bgr.tobytes()
    assert list(raw.images["/depth/compressed"].encoded()) == pngs
    assert np.stack(list(raw.images["/depth/compressed"].frames())).tobytes() == bgr.tobytes()


def test_split_by_a_topic_makes_an_episode_per_marker(tmp_path: Path) -> None:
    """[source] split: each /episode_start message starts an episode holding the messages up to
    the next; each is its own grid by the same rule; a bag without the topic is one line."""
    src = tmp_path / "bags"
    src.mkdir()
    _copy_without(bag_path("rosbag_mcap", 1), src / "run", "", marks=(50_000_000, 900_000_000))
    r = RosbagReader(src, {"split": "/episode_start", "latched": ["/task"]})
    r.rate = FPS
    assert r.episodes() == ["run#0", "run#1"] and r.file("run#1") == str(src / "run")
    with AnyReader([src / "run"], default_typestore=get_typestore(Stores.ROS2_HUMBLE)) as rd:
        m0, m1 = rd.start_time + 50_000_000, rd.start_time + 900_000_000
    for ref, within in (("run#0", (m0, m1)), ("run#1", (m1, 2**63))):
        raw = r.read(ref)
        want = expected(src / "run", latched=("/task",), within=within)
        assert raw.length == len(want["ticks"]) > 3
        assert want["start"] >= within[0]
        got = raw.arrays["/joint_states.position"]
        assert got.tobytes() == np.stack([m.position for m in want["/joint_states"]]).tobytes()
        assert raw.texts["/task"] == [m.data for m in want["/task"]]
    shutil.copytree(bag_path("rosbag_mcap", 0), src / "other")
    with pytest.raises(SourceError, match="no split topic '/episode_start'") as e:
        r.episodes()
    assert str(src / "other") in str(e.value)


def test_jobs_2_writes_the_same_bytes(tmp_path: Path, imported) -> None:
    out = tmp_path / "j2"
    r = ek("import", str(FIX / "rosbag_mcap"), "--out", str(out), "--fps", str(FPS), "--jobs", "2")
    assert r.returncode == 0, r.stderr
    one = imported["rosbag_mcap"][0]
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    differ = [str(f) for f in files if (one / f).read_bytes() != (out / f).read_bytes()]
    assert differ == []
