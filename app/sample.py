"""Write synthetic datasets in the exact LeRobot v3.0 (or v2.1) layout: tests, demo, benchmarks.

What it reproduces from LeRobot's own writers: ``meta/info.json`` with the feature contract,
``meta/tasks.parquet`` with the task string as the pandas index, ``meta/episodes/`` with the
per-episode ``stats/*`` columns, data files holding many episodes and rolling over at
``data_files_size_in_mb`` (chunks at ``chunks_size`` files), the ``huggingface`` schema metadata,
and the two row-group styles found in the wild: ``recorded`` (one row group per episode, what the
recorder writes) and ``edited`` (one row group per file, what the editing tools write).
Everything is generated with column operations, one file at a time.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodekit.core import staging
from episodekit.core.atomic import atomic_write_text
from episodekit.core.outdir import check_output_dir, mark_output_dir
from episodekit.core.paths import DATA_PATH_V2, DATA_PATH_V3, MIB, VIDEO_PATH_V2, VIDEO_PATH_V3
from episodekit.core.paths import SAMPLE_STYLES as STYLES
from episodekit.core.paths import SAMPLE_VERSIONS as VERSIONS
from episodekit.core.video import ENCODERS, VideoWriter, require_av
from episodekit.metadata import lerobot_stats

VIDEO_CODE_BITS = 24  # frame code: the dataset ``index`` as 3 rows of 8 black/white blocks
TASK_NAMES = (
    "pick up the red cube and place it in the bin",
    "open the top drawer",
    "fold the towel in half",
    "push the button",
    "stack the blue block on the green block",
    "wipe the table with the sponge",
    "insert the peg into the hole",
    "pour water into the cup",
    "hang the mug on the rack",
    "close the laptop lid",
)


@dataclass(frozen=True)
class SampleSpec:
    """Parameters of a synthetic dataset (see :func:`write_sample`)."""

    episodes: int = 50
    tasks: int = 6
    style: str = "recorded"
    images: bool = False
    videos: int = 0
    seed: int = 0
    fps: int = 30
    state_dim: int = 14
    action_dim: int = 14
    data_files_size_in_mb: float = 100
    video_files_size_in_mb: float = 200
    chunks_size: int = 1000
    version: str = "v3.0"
    tasks_index_name: str | None = "task"  # None: pandas' unnamed index (__index_level_0__)
    extra_column: bool = False  # an undeclared variable-length column, as some sources carry
    mean_length: float = 300.0
    video_size: tuple[int, int] = (48, 64)  # (height, width) of the encoded cameras
    video_codec: str = "av1"  # av1 (libsvtav1, LeRobot's default) or h264 (libx264)
    gop: int = 2  # keyframe interval (LeRobot: 2)
    crf: int = 30


def tiny_png() -> bytes:
    """A valid 2x2 RGB PNG (so decoders and header checks accept the image bytes)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    raw = b"".join(b"\x00" + bytes([200, 30, 30] * 2) for _ in range(2))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def episode_lengths_and_tasks(spec: SampleSpec) -> tuple[np.ndarray, np.ndarray]:
    """Per-episode lengths and task indices: each task has its own lognormal length distribution
    (some short, some long); with 4+ tasks the last two are rare (fewer than 10 episodes)."""
    rng = np.random.default_rng(spec.seed)
    n, t = spec.episodes, max(1, spec.tasks)
    # Task medians spread geometrically around the requested mean (x0.25 .. x2.2).
    medians = (
        spec.mean_length * np.geomspace(0.25, 2.2, t) if t > 1 else np.array([spec.mean_length])
    )
    rng.shuffle(medians)
    task_of = rng.integers(0, t, size=n)
    if t >= 4 and n >= 40:
        common = t - 2
        task_of = rng.integers(0, common, size=n)
        rare_counts = (3, 7)
        slots = rng.choice(n, size=sum(rare_counts), replace=False)
        task_of[slots[: rare_counts[0]]] = t - 2
        task_of[slots[rare_counts[0] :]] = t - 1
    sigma = 0.35
    lengths = rng.lognormal(np.log(medians[task_of]), sigma)
    lengths = np.clip(np.round(lengths), 5, None).astype(np.int64)
    return lengths, task_of.astype(np.int64)


def _fixed_list(values: np.ndarray) -> pa.FixedSizeListArray:
    n, d = values.shape
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), d)


def _image_array(n: int, png: bytes) -> pa.StructArray:
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * len(png))
    data = pa.py_buffer(png * n)
    binary = pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets.buffers()[1], data])
    paths = pa.nulls(n, pa.string())
    return pa.StructArray.from_arrays([binary, paths], names=["bytes", "path"])


def features_for(spec: SampleSpec) -> dict:
    """The ``features`` section of info.json for a spec (LeRobot 0.4 conventions)."""
    feats: dict = {
        "action": {
            "dtype": "float32",
            "shape": [spec.action_dim],
            "names": [f"a{i}" for i in range(spec.action_dim)],
        },
        "observation.state": {
            "dtype": "float32",
            "shape": [spec.state_dim],
            "names": [f"s{i}" for i in range(spec.state_dim)],
        },
    }
    if spec.images:
        feats["observation.images.wrist"] = {
            "dtype": "image",
            "shape": [2, 2, 3],
            "names": ["height", "width", "channels"],
        }
    h, w = spec.video_size
    for i in range(spec.videos):
        feats[f"observation.images.cam{i}"] = {
            "dtype": "video",
            "shape": [h, w, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": h,
                "video.width": w,
                "video.codec": spec.video_codec,
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": spec.fps,
                "video.channels": 3,
                "has_audio": False,
            },
        }
    for name, dtype in (
        ("timestamp", "float32"),
        ("frame_index", "int64"),
        ("episode_index", "int64"),
        ("index", "int64"),
        ("task_index", "int64"),
    ):
        feats[name] = {"dtype": dtype, "shape": [1], "names": None}
    return feats


def huggingface_metadata(features: dict) -> bytes:
    """The ``huggingface`` schema-metadata value (datasets' Features) for the data files."""
    hf = {}
    for name, f in features.items():
        if f["dtype"] == "video":
            continue
        if f["dtype"] == "image":
            hf[name] = {"_type": "Image"}
        elif f["shape"] == [1]:
            hf[name] = {"dtype": f["dtype"], "_type": "Value"}
        else:
            hf[name] = {
                "feature": {"dtype": f["dtype"], "_type": "Value"},
                "length": f["shape"][0],
                "_type": "Sequence",
            }
    return json.dumps({"info": {"features": hf}}).encode()


def joint_trajectories(
    rng: np.random.Generator, lengths: np.ndarray, dim: int, fps: float
) -> np.ndarray:
    """Smooth, bounded joint positions like a teleoperated arm's: every episode starts at the
    robot's home pose and each joint moves along a slow sinusoid (0.05-0.3 Hz, amplitude
    0.2-0.8) in seconds, so steps stay small whatever the episode length; plus encoder noise.
    (A random walk carried across episodes drifts without bound and jumps at file starts,
    which no recorded dataset does and which honest data-quality checks rightly flag.)"""
    n_ep, n = len(lengths), int(lengths.sum())
    home = np.linspace(-1.0, 1.0, dim, dtype=np.float32)
    amp = rng.uniform(0.2, 0.8, (n_ep, dim)).astype(np.float32)
    freq = rng.uniform(0.05, 0.3, (n_ep, dim)).astype(np.float32)
    phase = rng.uniform(0.0, 2 * np.pi, (n_ep, dim)).astype(np.float32)
    starts = np.cumsum(lengths) - lengths
    t = ((np.arange(n) - np.repeat(starts, lengths)) / fps).astype(np.float32)[:, None]
    a, f, p = (np.repeat(x, lengths, axis=0) for x in (amp, freq, phase))
    pose = home + a * (np.sin(2 * np.pi * f * t + p) - np.sin(p))
    return pose + rng.standard_normal((n, dim), dtype=np.float32) * 0.002


def _frames_table(
    spec: SampleSpec,
    rng: np.random.Generator,
    ep_ids: np.ndarray,
    lengths: np.ndarray,
    task_of: np.ndarray,
    start_index: int,
    png: bytes | None,
    hf_meta: bytes,
) -> pa.Table:
    n = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    frame_index = np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)
    state = joint_trajectories(rng, lengths, spec.state_dim, spec.fps)
    noise = rng.standard_normal((n, spec.action_dim), dtype=np.float32) * 0.01
    action = (
        state[:, : spec.action_dim]
        if spec.action_dim <= spec.state_dim
        else np.pad(state, ((0, 0), (0, spec.action_dim - spec.state_dim)))
    )
    action = (action + noise).astype(np.float32)
    cols: dict[str, pa.Array] = {
        "action": _fixed_list(action),
        "observation.state": _fixed_list(state.astype(np.float32)),
    }
    if spec.images:
        cols["observation.images.wrist"] = _image_array(n, png)
    cols["timestamp"] = pa.array((frame_index / spec.fps).astype(np.float32))
    cols["frame_index"] = pa.array(frame_index)
    cols["episode_index"] = pa.array(np.repeat(ep_ids, lengths))
    cols["index"] = pa.array(np.arange(start_index, start_index + n, dtype=np.int64))
    cols["task_index"] = pa.array(np.repeat(task_of, lengths))
    if spec.extra_column:
        # Sparse variable-length events: every 50th frame carries one.
        has = (frame_index % 50) == 0
        offsets = np.concatenate([[0], np.cumsum(has)]).astype(np.int32)
        values = pa.array(np.where(has[has], "event", ""), pa.string())
        cols["language_events"] = pa.ListArray.from_arrays(pa.array(offsets), values)
    table = pa.table(cols)
    return table.replace_schema_metadata({b"huggingface": hf_meta})


STATS_EXCLUDED_DTYPES = ("image", "video", "string")
# image/video stats of a sample: placeholders in [0, 1] (no frame is decoded), per channel
IMAGE_PLACEHOLDERS = {
    "min": 0.0,
    "max": 1.0,
    "mean": 0.5,
    "std": 0.25,
    **dict(zip(lerobot_stats.LEROBOT_QUANTILE_KEYS, (0.01, 0.1, 0.5, 0.9, 0.99))),
}


def _episode_stats(table: pa.Table, features: dict, lengths: np.ndarray) -> dict[str, pa.Array]:
    """Per-episode ``stats/<feature>/<stat>`` columns computed the way LeRobot does (its
    histogram quantiles, in the values' own dtype: metadata/lerobot_stats.py), as lists of
    doubles (count as list<int64>)."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    out: dict[str, pa.Array] = {}
    n_ep = len(lengths)
    for name, f in features.items():
        if f["dtype"] in STATS_EXCLUDED_DTYPES:
            continue
        col = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(col.type):
            d = col.type.list_size
            values = col.values.to_numpy().reshape(-1, d)
        else:
            d = 1
            values = col.to_numpy().reshape(-1, 1)
        per = [lerobot_stats.episode_stats(values[s : s + n]) for s, n in zip(starts, lengths)]
        offsets = pa.array(np.arange(n_ep + 1, dtype=np.int32) * d)
        for stat in ("min", "max", "mean", "std", *lerobot_stats.LEROBOT_QUANTILE_KEYS):
            mat = np.stack([p[stat] for p in per]).astype(np.float64)
            out[f"stats/{name}/{stat}"] = pa.ListArray.from_arrays(offsets, pa.array(mat.ravel()))
        offsets = pa.array(np.arange(n_ep + 1, dtype=np.int32))
        out[f"stats/{name}/count"] = pa.ListArray.from_arrays(offsets, pa.array(lengths))
    nested = pa.list_(pa.list_(pa.list_(pa.float64())))  # LeRobot's per-channel (3, 1, 1)
    for name, f in features.items():
        if f["dtype"] in ("image", "video"):
            for stat, v in IMAGE_PLACEHOLDERS.items():
                out[f"stats/{name}/{stat}"] = pa.array([[[[v]]] * 3] * n_ep, nested)
            out[f"stats/{name}/count"] = pa.ListArray.from_arrays(
                pa.array(np.arange(n_ep + 1, dtype=np.int32)), pa.array(lengths)
            )
    return out


def _write_data_file(path: Path, table: pa.Table, lengths: np.ndarray, style: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if style == "edited":
        pq.write_table(table, path, row_group_size=max(1, table.num_rows), compression="snappy")
        return
    with pq.ParquetWriter(path, table.schema, compression="snappy") as writer:
        start = 0
        for n in lengths.tolist():
            writer.write_table(table.slice(start, n), row_group_size=n)
            start += n


def _tasks_table(tasks: list[str], index_name: str | None) -> pa.Table:
    col = index_name or "__index_level_0__"
    pandas_meta = {
        "index_columns": [col],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": index_name,
                "field_name": col,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    table = pa.table(
        {"task_index": pa.array(np.arange(len(tasks), dtype=np.int64)), col: pa.array(tasks)}
    )
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def _task_names(n: int) -> list[str]:
    names = list(TASK_NAMES[:n])
    names += [f"task number {i}" for i in range(len(names), n)]
    return names


def write_sample(
    root: str | os.PathLike, spec: SampleSpec | None = None, force: bool = False, **kwargs
) -> Path:
    """Write a synthetic LeRobot dataset to ``root`` and return its path.

    ``root`` must be missing, empty or a sample written earlier (its marker file; it is replaced)
    unless ``force``; never the current folder, a parent of it, ``/`` or ``$HOME``
    (:func:`~episodekit.core.outdir.check_output_dir`, raises before anything is deleted).
    ``kwargs`` override fields of ``spec`` (e.g. ``write_sample(p, episodes=10, style="edited")``).
    """
    spec = spec or SampleSpec()
    if kwargs:
        spec = SampleSpec(**{**spec.__dict__, **kwargs})
    if spec.style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {spec.style!r}")
    if spec.version not in VERSIONS:
        raise ValueError(f"version must be one of {VERSIONS}, got {spec.version!r}")
    if spec.episodes < 1:
        raise ValueError("episodes must be >= 1")
    if spec.videos:
        require_av()  # before anything is written: says what to install
        if spec.video_codec not in ENCODERS:
            raise ValueError(f"video_codec must be one of {tuple(ENCODERS)}")
    root = check_output_dir(root, force=force, option="--force")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging.remove_stale(root)
    work = staging.new_staging(root)  # written aside, then swapped in: never a half sample
    try:
        mark_output_dir(work, "episodekit sample")
        (work / "meta").mkdir()
        if spec.version == "v2.1":
            _write_v21(work, spec)
        else:
            _write_v30(work, spec)
        staging.publish(work, root)
    except BaseException:
        staging.discard(work, root)
        raise
    return root


def _plan_files(byte_sizes: np.ndarray, limit_bytes: float) -> np.ndarray:
    """File number per episode: roll over to a new file once the current one reaches the limit
    (LeRobot's rule: an episode goes to the current file unless that file is already full)."""
    file_of = np.zeros(len(byte_sizes), dtype=np.int64)
    current, acc = 0, 0.0
    for i, b in enumerate(byte_sizes.tolist()):  # per episode, not per frame
        if acc > 0 and acc + b > limit_bytes:
            current, acc = current + 1, 0.0
        file_of[i] = current
        acc += b
    return file_of


def _bytes_per_frame(spec: SampleSpec, png_len: int) -> float:
    b = 4 * (spec.state_dim + spec.action_dim) + 4 + 4 * 8
    if spec.images:
        b += png_len + 8
    return float(b)


def synthetic_frames(index: np.ndarray, height: int, width: int, camera: int = 0) -> np.ndarray:
    """Decodable test content, (N, H, W, 3) uint8: a gradient moving with the frame, and the frame's
    dataset ``index`` written in its top 3/8 as 24 black/white blocks (see :func:`read_frame_code`),
    which survive lossy coding so tests can tell which frame a decoder returned."""
    index = np.asarray(index, dtype=np.int64)
    h, w = height, width
    bh, bw = max(1, h // 8), max(1, w // 8)
    y = np.arange(h)[None, :, None]
    x = np.arange(w)[None, None, :]
    t = index[:, None, None]
    img = np.empty((len(index), h, w, 3), dtype=np.uint8)
    img[..., 0] = ((x * 4 + t * 3) % 256).astype(np.uint8)
    img[..., 1] = ((y * 4 + t * (2 + camera)) % 256).astype(np.uint8)
    img[..., 2] = (((x + y) * 2 + 85 * camera) % 256).astype(np.uint8)
    bits = (index[:, None] >> np.arange(VIDEO_CODE_BITS)[None, :]) & 1  # (N, 24)
    blocks = bits.reshape(-1, 3, 8).astype(np.uint8) * 255
    code = np.repeat(np.repeat(blocks, bh, axis=1), bw, axis=2)  # (N, 3*bh, 8*bw)
    img[:, : 3 * bh, : 8 * bw, :] = code[..., None]
    return img


def read_frame_code(image: np.ndarray) -> int:
    """The dataset ``index`` :func:`synthetic_frames` wrote into an (H, W, 3) RGB frame (CHW works
    too) decoded at its original size: the mean of each block's centre, thresholded."""
    img = np.asarray(image)
    if img.shape[0] == 3 and img.shape[-1] != 3:
        img = np.moveaxis(img, 0, -1)
    h, w = img.shape[:2]
    bh, bw = max(1, h // 8), max(1, w // 8)
    gray = img[: 3 * bh, : 8 * bw].astype(np.float64).mean(axis=2)
    blocks = gray.reshape(3, bh, 8, bw)
    mh, mw = slice(bh // 4, bh - bh // 4 or 1), slice(bw // 4, bw - bw // 4 or 1)
    centre = blocks[:, mh][:, :, :, mw].mean(axis=(1, 3)).reshape(-1)
    return int(((centre > 127).astype(np.int64) << np.arange(VIDEO_CODE_BITS)).sum())


def _camera_writer(path: Path, spec: SampleSpec) -> VideoWriter:
    h, w = spec.video_size
    return VideoWriter(
        path,
        w,
        h,
        spec.fps,
        codec=spec.video_codec,
        gop=spec.gop,
        crf=spec.crf,
        preset="12" if spec.video_codec == "av1" else "ultrafast",
        threads=1,  # tiny frames: one thread is as fast, and the bytes are reproducible
    )


def _encode_episode(writer: VideoWriter, spec: SampleSpec, camera: int, start: int, n: int) -> None:
    """One episode's frames (dataset index start..start+n), starting on a keyframe."""
    h, w = spec.video_size
    step = max(1, (8 << 20) // (h * w * 3))  # ~8 MiB of RGB per call
    for a in range(0, n, step):
        idx = np.arange(start + a, start + min(n, a + step))
        writer.write(synthetic_frames(idx, h, w, camera), keyframe_first=a == 0)


def _encode_file(
    vpath: Path, spec: SampleSpec, camera: int, episodes: list[tuple[int, int]], tries: int = 3
) -> None:
    """Encode one mp4 of ``(first index, length)`` episodes. Before the writer asked libsvtav1
    for low-delay prediction, it now and then handed the muxer a DTS that went backwards (only on
    a loaded machine); should that recur, the frames are a pure function of the spec, so the file
    is encoded again rather than failing the sample."""
    av = require_av()
    for attempt in range(tries):
        try:
            with _camera_writer(vpath, spec) as writer:
                for start, n in episodes:
                    _encode_episode(writer, spec, camera, start, n)
            return
        except av.error.ArgumentError:
            if attempt == tries - 1:
                raise


def _write_camera_v30(
    root: Path, spec: SampleSpec, camera: int, lengths: np.ndarray, from_index: np.ndarray
) -> dict[str, pa.Array]:
    """Encode one camera as LeRobot v3.0 does: episodes appended to the current mp4 (each starting
    on a keyframe), a new file once the current one would pass ``video_files_size_in_mb`` (by an
    estimate that differs per camera, so cameras roll over at different episodes)."""
    key = f"observation.images.cam{camera}"
    h, w = spec.video_size
    est_bytes_per_frame = h * w * 0.05 * (1 + 0.3 * camera)
    vfile = _plan_files(lengths * est_bytes_per_frame, spec.video_files_size_in_mb * MIB)
    frames_before = np.zeros(len(lengths), dtype=np.int64)
    for f in np.unique(vfile).tolist():
        sel = np.flatnonzero(vfile == f)
        frames_before[sel] = np.cumsum(lengths[sel]) - lengths[sel]
        vpath = root / VIDEO_PATH_V3.format(
            video_key=key, chunk_index=f // spec.chunks_size, file_index=f % spec.chunks_size
        )
        vpath.parent.mkdir(parents=True, exist_ok=True)
        _encode_file(vpath, spec, camera, [(int(from_index[e]), int(lengths[e])) for e in sel])
    return {
        f"videos/{key}/chunk_index": pa.array(vfile // spec.chunks_size),
        f"videos/{key}/file_index": pa.array(vfile % spec.chunks_size),
        f"videos/{key}/from_timestamp": pa.array(frames_before / spec.fps),
        f"videos/{key}/to_timestamp": pa.array((frames_before + lengths) / spec.fps),
    }


def _write_v30(root: Path, spec: SampleSpec) -> None:
    lengths, task_of = episode_lengths_and_tasks(spec)
    rng = np.random.default_rng(spec.seed + 1)
    features = features_for(spec)
    hf_meta = huggingface_metadata(features)
    png = tiny_png() if spec.images else None
    tasks = _task_names(spec.tasks)
    n_ep = len(lengths)
    ep_ids = np.arange(n_ep, dtype=np.int64)
    to_index = np.cumsum(lengths)
    from_index = to_index - lengths

    per_frame = _bytes_per_frame(spec, len(png or b""))
    file_seq = _plan_files(lengths * per_frame, spec.data_files_size_in_mb * MIB)
    data_chunk = file_seq // spec.chunks_size
    data_file = file_seq % spec.chunks_size

    episode_cols: dict[str, pa.Array] = {}
    stats_parts: list[dict[str, pa.Array]] = []
    for f in np.unique(file_seq).tolist():
        sel = np.flatnonzero(file_seq == f)
        table = _frames_table(
            spec,
            rng,
            ep_ids[sel],
            lengths[sel],
            task_of[sel],
            int(from_index[sel[0]]),
            png,
            hf_meta,
        )
        path = root / DATA_PATH_V3.format(
            chunk_index=int(data_chunk[sel[0]]), file_index=int(data_file[sel[0]])
        )
        _write_data_file(path, table, lengths[sel], spec.style)
        stats_parts.append(_episode_stats(table, features, lengths[sel]))

    for name in stats_parts[0]:
        episode_cols[name] = pa.concat_arrays([p[name] for p in stats_parts])

    video_cols: dict[str, pa.Array] = {}
    for i in range(spec.videos):
        video_cols.update(_write_camera_v30(root, spec, i, lengths, from_index))

    task_lists = pa.ListArray.from_arrays(
        pa.array(np.arange(n_ep + 1, dtype=np.int32)),
        pa.array([tasks[t] for t in task_of.tolist()]),
    )
    cols: dict[str, pa.Array] = {
        "episode_index": pa.array(ep_ids),
        "data/chunk_index": pa.array(data_chunk),
        "data/file_index": pa.array(data_file),
        "dataset_from_index": pa.array(from_index),
        "dataset_to_index": pa.array(to_index),
        **video_cols,
        "tasks": task_lists,
        "length": pa.array(lengths),
        **episode_cols,
    }
    # Episode metadata files roll over like data files (by an estimate of their row size).
    meta_row_bytes = 2000 + 300 * (spec.state_dim + spec.action_dim)
    meta_seq = _plan_files(
        np.full(n_ep, meta_row_bytes, dtype=np.float64), spec.data_files_size_in_mb * MIB
    )
    cols["meta/episodes/chunk_index"] = pa.array(meta_seq // spec.chunks_size)
    cols["meta/episodes/file_index"] = pa.array(meta_seq % spec.chunks_size)
    episodes = pa.table(cols)
    for f in np.unique(meta_seq).tolist():
        sel = np.flatnonzero(meta_seq == f)
        part = episodes.slice(int(sel[0]), len(sel))
        chunk, fnum = divmod(f, spec.chunks_size)
        path = root / f"meta/episodes/chunk-{chunk:03d}/file-{fnum:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(part, path)

    pq.write_table(_tasks_table(tasks, spec.tasks_index_name), root / "meta/tasks.parquet")
    _write_info_and_stats(root, spec, features, lengths, episodes)


def _dataset_stats(episodes: pa.Table, features: dict) -> dict[str, dict[str, list]]:
    """stats.json from the per-episode stats columns, aggregated LeRobot's way."""
    out = {}
    for name, f in features.items():
        if f["dtype"] in STATS_EXCLUDED_DTYPES and f["dtype"] not in ("image", "video"):
            continue
        keys = [
            k for k in ("min", "max", "mean", "std", "count", *lerobot_stats.LEROBOT_QUANTILE_KEYS)
        ]
        cols = {k: episodes[f"stats/{name}/{k}"].to_pylist() for k in keys}
        per = [{k: np.asarray(cols[k][e]) for k in keys} for e in range(episodes.num_rows)]
        agg = lerobot_stats.aggregate(per)
        out[name] = {k: np.asarray(v).tolist() for k, v in agg.items()}
    return out


def _write_info_and_stats(
    root: Path, spec: SampleSpec, features: dict, lengths: np.ndarray, episodes: pa.Table | None
) -> None:
    n_ep = len(lengths)
    info = {
        "codebase_version": spec.version,
        "robot_type": "sample_bot",
        "total_episodes": n_ep,
        "total_frames": int(lengths.sum()),
        "total_tasks": spec.tasks,
        "chunks_size": spec.chunks_size,
        "fps": spec.fps,
        "splits": {"train": f"0:{n_ep}"},
        "features": features,
    }
    if spec.version == "v3.0":
        info.update(
            data_files_size_in_mb=spec.data_files_size_in_mb,
            video_files_size_in_mb=spec.video_files_size_in_mb,
            data_path=DATA_PATH_V3,
            video_path=VIDEO_PATH_V3 if spec.videos else None,
        )
    else:
        info.update(
            total_chunks=int((n_ep - 1) // spec.chunks_size + 1),
            total_videos=n_ep * spec.videos,
            data_path=DATA_PATH_V2,
            video_path=VIDEO_PATH_V2 if spec.videos else None,
        )
    atomic_write_text(root / "meta/info.json", json.dumps(info, indent=4))
    stats = {}
    if episodes is not None:
        # Dataset stats as LeRobot 0.4.4 writes them: its aggregation of the episodes' stats
        # (count-weighted mean and quantiles, parallel-variance std)
        stats = _dataset_stats(episodes, features)
    atomic_write_text(root / "meta/stats.json", json.dumps(stats, indent=4))


def _write_v21(root: Path, spec: SampleSpec) -> None:
    lengths, task_of = episode_lengths_and_tasks(spec)
    rng = np.random.default_rng(spec.seed + 1)
    features = features_for(spec)
    hf_meta = huggingface_metadata(features)
    png = tiny_png() if spec.images else None
    tasks = _task_names(spec.tasks)
    start = 0
    episodes_lines, stats_lines = [], []
    per_episode: list[dict] = []
    for e, (n, t) in enumerate(zip(lengths.tolist(), task_of.tolist())):
        table = _frames_table(
            spec, rng, np.array([e]), np.array([n]), np.array([t]), start, png, hf_meta
        )
        path = root / DATA_PATH_V2.format(episode_chunk=e // spec.chunks_size, episode_index=e)
        _write_data_file(path, table, np.array([n]), "edited")
        for i in range(spec.videos):
            vpath = root / VIDEO_PATH_V2.format(
                episode_chunk=e // spec.chunks_size,
                video_key=f"observation.images.cam{i}",
                episode_index=e,
            )
            vpath.parent.mkdir(parents=True, exist_ok=True)
            _encode_file(vpath, spec, i, [(start, n)])
        episodes_lines.append(json.dumps({"episode_index": e, "tasks": [tasks[t]], "length": n}))
        per_episode.append(_v21_episode_stats(table, features, n))
        stats_lines.append(json.dumps({"episode_index": e, "stats": per_episode[-1]}))
        start += n
    (root / "meta/episodes.jsonl").write_text("\n".join(episodes_lines) + "\n")
    (root / "meta/episodes_stats.jsonl").write_text("\n".join(stats_lines) + "\n")
    (root / "meta/tasks.jsonl").write_text(
        "\n".join(json.dumps({"task_index": i, "task": s}) for i, s in enumerate(tasks)) + "\n"
    )
    _write_info_and_stats(root, spec, features, lengths, None)
    atomic_write_text(root / "meta/stats.json", json.dumps(_v21_dataset_stats(per_episode)))


def _v21_episode_stats(table: pa.Table, features: dict, n: int) -> dict[str, dict[str, list]]:
    """One episode's stats as LeRobot's v2.1 recorder wrote them in ``episodes_stats.jsonl``:
    min, max, mean, std, count per feature (no quantiles: LeRobot added them with v3.0); image
    and video features per channel, shape (3, 1, 1), placeholders in [0, 1] as in the v3.0
    sample."""
    out: dict[str, dict[str, list]] = {}
    for name, f in features.items():
        if f["dtype"] in ("image", "video"):
            chan = {k: [[[v]]] * 3 for k, v in (("min", 0.0), ("max", 1.0), ("mean", 0.5))}
            out[name] = {**chan, "std": [[[0.25]]] * 3, "count": [n]}
            continue
        if f["dtype"] in STATS_EXCLUDED_DTYPES:
            continue
        col = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(col.type):
            x = col.values.to_numpy().reshape(n, -1)
        else:
            x = col.to_numpy().reshape(n, 1)
        st = lerobot_stats.episode_stats(x)  # LeRobot's arithmetic, in the values' dtype
        out[name] = {k: np.asarray(st[k]).tolist() for k in ("min", "max", "mean", "std", "count")}
    return out


def _v21_dataset_stats(per_episode: list[dict]) -> dict[str, dict[str, list]]:
    """stats.json of a v2.1 sample: LeRobot's aggregation of the episodes' stats."""
    out = {}
    for name in per_episode[0] if per_episode else []:
        per = [{k: np.asarray(v) for k, v in ep[name].items()} for ep in per_episode]
        out[name] = {k: np.asarray(v).tolist() for k, v in lerobot_stats.aggregate(per).items()}
    return out
