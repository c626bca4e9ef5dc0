"""``edit`` checks what it is given as it checks data (issue 48, findings 5 and 7), run as a user
runs it (the CLI as a subprocess) on copies of the LeRobot-written fixtures:

- ``--add-feature`` keys are two exact integers (no packing that two keys could share), values
  finite unless ``--allow-nan``, shapes and dtypes checked before any write (an empty vector is
  one line, never SIGFPE), values needed only for the frames the edit keeps; reserved names and
  contradicting options refused. Each failure: one line naming the option and the file, exit 2,
  nothing written;
- a frames file with a huge number is one line; ``--images-to-video`` encodes odd frame sizes
  (as LeRobot does) and, after an error, leaves no encoder noise on stderr;
- the text output says per camera whether frames were copied as packets or re-encoded, with
  the worst PSNR measured.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.dataset import open_dataset
from tests.app.hostile import cli, copy_fixture, ok, one_error


def rows(root: Path) -> pa.Table:
    ds = open_dataset(str(root))
    return pa.concat_tables(pq.read_table(ds.join(f)) for f in ds.data_files)


@pytest.fixture(scope="module")
def rec40(tmp_path_factory) -> Path:
    return copy_fixture("rec40", tmp_path_factory.mktemp("src") / "rec40")


@pytest.fixture(scope="module")
def frames(rec40) -> tuple[np.ndarray, np.ndarray]:
    """(episode_index, frame_index) of every frame of rec40."""
    ds = open_dataset(str(rec40))
    ep = np.repeat(ds.column("episode_index"), ds.column("length"))
    fi = np.concatenate([np.arange(n) for n in ds.column("length")])
    return ep, fi


def values_file(path: Path, ep, fi, value) -> Path:
    pq.write_table(pa.table({"episode_index": ep, "frame_index": fi, "value": value}), path)
    return path


def refused(rec40: Path, out: Path, *args, words: str, code: int = 2) -> str:
    """The run fails with ``code``, one line holding ``words``, nothing written at ``out``."""
    line = one_error(cli("edit", rec40, "--out", out, *args), code)
    assert words in line, line
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.episodekit-*"))
    return line


# --- keys --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame, key",
    [((4, 5), (3, 2**32 + 5)), ((0, 5), (2**32, 5))],
    ids=["frame-past-its-episode", "int64-wrap"],
)
def test_a_key_never_lands_on_another_frame(rec40, frames, frame, key, tmp_path):
    """Keys were packed as episode * 2**32 + frame: (3, 2**32 + 5) was episode 4 frame 5, and
    (2**32, 5) wrapped around int64 onto episode 0 frame 5, both published "(verified)". Each
    names no frame of rec40, and says so."""
    ep, fi = frames
    ep, fi = ep.copy(), fi.copy()
    i = int(np.flatnonzero((ep == frame[0]) & (fi == frame[1]))[0])
    ep[i], fi[i] = key
    f = values_file(tmp_path / "alias.parquet", ep, fi, fi * 1.0)
    line = refused(rec40, tmp_path / "o", "--add-feature", "r", "--from", f,
                   words=f"episode {key[0]} frame {key[1]} is not a frame of")  # fmt: skip
    assert f"--add-feature r --from {f}" in line


@pytest.mark.parametrize(
    "keys, words",
    [
        (([1e30], [0.0]), "episode_index 1e+30 names no frame"),
        ((["0"], [0]), "episode_index is string, not integers"),
    ],
)
def test_keys_that_are_not_exact_integers_are_refused(rec40, keys, words, tmp_path):
    f = values_file(tmp_path / "k.parquet", keys[0], keys[1], [1.0])
    refused(rec40, tmp_path / "o", "--add-feature", "r", "--from", f, words=words)


# --- values ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_refused_unless_allowed(rec40, frames, bad, tmp_path):
    ep, fi = frames
    value = fi * 1.0
    value[10] = bad
    f = values_file(tmp_path / "v.parquet", ep, fi, value)
    refused(rec40, tmp_path / "o", "--add-feature", "r", "--from", f,
            words="episode 0 frame 10 has a")  # fmt: skip
    r = ok(cli("edit", rec40, "--out", tmp_path / "o", "--add-feature", "r", "--from", f,
               "--allow-nan"))  # fmt: skip
    assert "1 kept frame with NaN or inf written as given (--allow-nan)" in r.stdout
    assert "Warning" not in r.stderr, r.stderr  # numpy's warnings on the NaN stats: silenced
    got = rows(tmp_path / "o")["r"].to_numpy()
    assert np.array_equal(got, value, equal_nan=True)
    v = cli("validate", tmp_path / "o", "--json")
    checks = {f["check"] for f in json.loads(v.stdout)["findings"]}
    assert v.returncode == 1 and "data.nan" in checks, checks


def test_a_nan_inside_a_vector_is_refused(rec40, frames, tmp_path):
    ep, fi = frames
    vec = np.stack([fi * 1.0, fi * 2.0], axis=1)
    vec[7, 1] = np.nan
    path = tmp_path / "v.npy"
    np.save(path, np.concatenate([np.stack([ep, fi], axis=1), vec], axis=1))
    refused(rec40, tmp_path / "o", "--add-feature", "r", "--from", path,
            words="episode 0 frame 7 has a NaN value")  # fmt: skip


def test_null_list_elements_are_refused(rec40, frames, tmp_path):
    ep, fi = frames
    value = [[float(x), 1.0] for x in fi]
    value[7] = [None, 1.0]
    f = values_file(tmp_path / "v.parquet", ep, fi, value)
    refused(rec40, tmp_path / "o", "--add-feature", "r", "--from", f,
            words="1 list elements are null")  # fmt: skip


def test_empty_vectors_are_one_line_never_sigfpe(rec40, frames, tmp_path):
    """A fixed_size_list of length 0 killed the writer with SIGFPE inside pyarrow (exit 136)."""
    ep, fi = frames
    empty = pa.array([[]] * len(ep), pa.list_(pa.float32()))
    f = values_file(tmp_path / "v.parquet", ep, fi, empty)
    refused(rec40, tmp_path / "o", "--add-feature", "r", "--from", f,
            words="every value is an empty list")  # fmt: skip
    arr = np.zeros(len(ep), dtype=[("episode_index", "i8"), ("frame_index", "i8"),
                                   ("value", "f4", (0,))])  # fmt: skip
    arr["episode_index"], arr["frame_index"] = ep, fi
    np.save(tmp_path / "v.npy", arr)
    refused(rec40, tmp_path / "o", "--add-feature", "r", "--from", tmp_path / "v.npy",
            words="every value is an empty list")  # fmt: skip


# --- frames the edit drops ---------------------------------------------------------------------


def test_values_are_needed_only_for_the_frames_kept(rec40, frames, tmp_path):
    """A file without episode 0's frames 0..9 serves an edit that drops them; a NaN in a dropped
    frame is not looked at; the kept frames get the file's values (by source frame)."""
    ep, fi = frames
    keep = ~((ep == 0) & (fi < 10))
    value = ep * 1000.0 + fi
    value[~keep] = np.nan  # ignored: those frames are dropped
    partial = values_file(tmp_path / "partial.parquet", ep[keep], fi[keep], value[keep])
    full = values_file(tmp_path / "full.parquet", ep, fi, value)
    for f in (partial, full):
        out = tmp_path / f.stem
        ok(cli("edit", rec40, "--out", out, "--add-feature", "r", "--from", f,
               "--drop-frames", "0:0-9,5:3-4", "--drop-episodes", "7"))  # fmt: skip
        got = rows(out)
        src = rows(rec40)
        sep, sfi = src["episode_index"].to_numpy(), src["frame_index"].to_numpy()
        kept = keep & ~((sep == 5) & ((sfi == 3) | (sfi == 4))) & (sep != 7)
        np.testing.assert_array_equal(got["r"].to_numpy(), (sep * 1000.0 + sfi)[kept])
    line = refused(rec40, tmp_path / "o", "--add-feature", "r", "--from", partial,
                   "--drop-frames", "0:0-8",
                   words="has no value for episode 0 frame 9")  # fmt: skip
    assert str(partial) in line


# --- names and contradicting options -----------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["--rename-feature", "action=task"], "'task' is a name LeRobot reserves"),
        (["--rename-feature", "action=task_index"], "'task_index' is a name LeRobot reserves"),
        (["--rename-feature", "action=action_is_pad"], "is a name LeRobot reserves"),
        (["--rename-feature", "action=a", "--remove-feature", "action"],
         "--rename-feature action=a: 'action' is also given to --remove-feature"),
        (["--rename-feature", "action=a", "--rename-feature", "action=b"],
         "--rename-feature action=b: 'action' is renamed twice (also to 'a')"),
        (["--rename-feature", "action=a", "--rename-feature", "observation.state=a"],
         "--rename-feature observation.state=a: 'action' is renamed to 'a' too"),
        (["--rename-feature", "action=a", "--add-feature", "a", "--from", "{good}"],
         "--add-feature a: also the new name of --rename-feature action=a"),
        (["--add-feature", "a", "--from", "{good}", "--add-feature", "a", "--from", "{good}"],
         "--add-feature a: given twice"),
        (["--add-feature", "task", "--from", "{good}"], "'task' is a name LeRobot reserves"),
        (["--allow-nan"], "--allow-nan is read for --add-feature"),
    ],
)  # fmt: skip
def test_reserved_names_and_contradicting_options_are_refused(rec40, frames, args, words, tmp_path):
    good = values_file(tmp_path / "good.parquet", *frames, frames[1] * 1.0)
    args = [a.replace("{good}", str(good)) for a in args]
    refused(rec40, tmp_path / "o", *args, words=words)


# --- unreadable --from files -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("v.parquet", b"not parquet", "unreadable parquet"),
        ("v.npy", b"not npy", "cannot read it as npy"),
    ],
)
def test_an_unreadable_from_file_is_named_with_its_option(rec40, name, content, words, tmp_path):
    f = tmp_path / name
    f.write_bytes(content)
    line = refused(rec40, tmp_path / "o", "--add-feature", "r", "--from", f, words=words)
    assert f"--add-feature r --from {f}" in line


def test_an_object_npy_is_named_with_its_option(rec40, tmp_path):
    f = tmp_path / "v.npy"
    np.save(f, np.array([[0, 0, "x"]], dtype=object), allow_pickle=True)
    refused(rec40, tmp_path / "o", "--add-feature", "r", "--from", f,
            words=f"--add-feature r --from {f}: cannot read it as npy")  # fmt: skip


def test_a_frames_file_with_a_huge_number_is_one_line(rec40, tmp_path):
    f = tmp_path / "frames.json"
    f.write_text(json.dumps([{"episode": 0, "start": 0, "end": 10**30}]))
    line = refused(rec40, tmp_path / "o", "--drop-frames", f,
                   words="range 0 has a number larger than any index")  # fmt: skip
    assert line.startswith(f"Error: --drop-frames: {f}")


# --- images to video ---------------------------------------------------------------------------


def _rewrite_images(root: Path, fn) -> None:
    """Every image cell of ``root``'s data files replaced by ``fn(row, cell)`` (the bytes)."""
    for f in sorted((root / "data").rglob("*.parquet")):
        t = pq.read_table(f)
        for name in [n for n in t.column_names if n.startswith("observation.images")]:
            field = t.schema.field(name)
            cells = [dict(c, bytes=fn(name, i, c)) for i, c in enumerate(t[name].to_pylist())]
            t = t.set_column(t.schema.get_field_index(name), field, pa.array(cells, field.type))
        pq.write_table(t, f)


def test_odd_frame_sizes_are_encoded_as_lerobot_does(tmp_path):
    """127x95 images (libsvtav1 encodes odd sizes; LeRobot's recorder asks it to): the video
    holds them at their size, every frame close to its image, the output validates --deep.
    Verification once failed on them with "unexpected AssertionError: width has to be even"."""
    av = pytest.importorskip("av")
    image = pytest.importorskip("PIL.Image")
    src = copy_fixture("img6", tmp_path / "src")
    sources = {}

    def resized(name, i, cell):
        im = image.open(io.BytesIO(cell["bytes"])).convert("RGB").resize((127, 95))
        sources[(name, i)] = np.asarray(im)
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        return buf.getvalue()

    _rewrite_images(src, resized)
    info = json.loads((src / "meta/info.json").read_text())
    for f in info["features"].values():
        if f["dtype"] == "image":
            f["shape"] = [95, 127, 3]
    (src / "meta/info.json").write_text(json.dumps(info, indent=4))
    out = tmp_path / "out"
    r = ok(cli("edit", src, "--out", out, "--images-to-video"))
    assert "observation.images.top: 79 frames encoded from images" in r.stdout
    feats = json.loads((out / "meta/info.json").read_text())["features"]
    mp4 = out / "videos/observation.images.top/chunk-000/file-000.mp4"
    with av.open(str(mp4)) as c:
        got = [fr.to_ndarray(format="rgb24") for fr in c.decode(video=0)]
    assert feats["observation.images.top"]["info"]["video.width"] == 127
    assert got[0].shape == (95, 127, 3) and len(got) == 79
    want = [sources[("observation.images.top", i)] for i in range(79)]  # one episode order
    from episodekit.writers.image_video import psnr_db

    assert min(psnr_db(a, b) for a, b in zip(got, want)) >= 35
    ok(cli("validate", out, "--deep"))


def test_an_error_while_encoding_leaves_one_line_on_stderr(tmp_path):
    """A PNG that does not decode half-way through a camera: exit 1, our one line, and no
    "Svt[error]: deinit called without sending EOS!" from the encoder closed mid-stream."""
    pytest.importorskip("av")
    pytest.importorskip("PIL.Image")
    src = copy_fixture("img6", tmp_path / "src")
    _rewrite_images(src, lambda name, i, c: b"\x89PNG\r\n\x1a\n cut" if i == 40 else c["bytes"])
    out = tmp_path / "out"
    r = cli("edit", src, "--out", out, "--images-to-video")
    line = one_error(r, 1)
    assert "episode 4 frame 0: " in line and "Svt" not in r.stderr, r.stderr
    assert [ln for ln in r.stderr.splitlines() if not ln[:1].islower()] == [line], r.stderr
    assert not out.exists()


# --- what the text output says of the video ----------------------------------------------------


def test_text_output_says_per_camera_what_was_reencoded(tmp_path):
    pytest.importorskip("av")
    src = copy_fixture("vid24", tmp_path / "vid24")
    cams = ("observation.images.top", "observation.images.wrist")
    r = ok(cli("edit", src, "--out", tmp_path / "cut", "--drop-frames", "0:3-8"))
    assert "copying the video packets" not in r.stderr, r.stderr
    for cam in cams:
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(f"{cam}: "))
        assert "1 frame re-encoded (1 group of pictures a cut fell in, worst frame" in line
        assert float(line.split("worst frame ")[1].split(" dB")[0]) >= 40, line
    d = json.loads(ok(cli("edit", src, "--out", tmp_path / "cut2", "--drop-frames", "0:3-8",
                          "--json")).stdout)["video_cut"]  # fmt: skip
    assert set(d["cameras"]) == set(cams)
    assert sum(c["frames_reencoded"] for c in d["cameras"].values()) == d["frames_reencoded"]
    assert min(c["min_psnr_db"] for c in d["cameras"].values()) == d["min_psnr_db"]
    r = ok(cli("edit", src, "--out", tmp_path / "keyframes", "--drop-frames", "0:2-3"))
    for cam in cams:  # cut on keyframes: nothing re-encoded, and it says so
        assert f"{cam}: 2,425 frames copied as packets" in r.stdout
    assert "re-encoded" not in r.stdout
    r = ok(cli("edit", src, "--out", tmp_path / "whole", "--drop-episodes", "3"))
    assert "copying the video packets of 2 cameras" in r.stderr
    assert not [ln for ln in r.stdout.splitlines() if ln.startswith("observation.")]


def test_text_output_gives_each_encoded_cameras_psnr(tmp_path):
    pytest.importorskip("av")
    pytest.importorskip("PIL.Image")
    src = copy_fixture("img6", tmp_path / "img6")
    r = ok(cli("edit", src, "--out", tmp_path / "out", "--images-to-video"))
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("observation.images.")]
    assert len(lines) == 2 and all("frames encoded from images" in ln for ln in lines), r.stdout
    assert all(" dB PSNR against the encoder's input, " in ln for ln in lines)
