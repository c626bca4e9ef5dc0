"""The tables of a synthetic sample, made with column operations: frames (joint trajectories,
images, language columns), ``features`` and the ``huggingface`` schema metadata, per-episode
stats columns and ``stats.json`` (LeRobot's aggregation). LeRobot's file roll-over rule lives in
core (:mod:`episodekit.core.layout`), the tasks table with the writers
(:func:`episodekit.writers.sink_meta.tasks_table`)."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pyarrow as pa

from episodekit.metadata import lerobot_stats
from episodekit.sample.spec import TASK_NAMES, SampleSpec


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


def frames_table(
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


def episode_stats_columns(
    table: pa.Table, features: dict, lengths: np.ndarray
) -> dict[str, pa.Array]:
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


def task_names(n: int) -> list[str]:
    names = list(TASK_NAMES[:n])
    names += [f"task number {i}" for i in range(len(names), n)]
    return names


def bytes_per_frame(spec: SampleSpec, png_len: int) -> float:
    b = 4 * (spec.state_dim + spec.action_dim) + 4 + 4 * 8
    if spec.images:
        b += png_len + 8
    return float(b)


def v21_episode_stats(table: pa.Table, features: dict, n: int) -> dict[str, dict[str, list]]:
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


def v21_dataset_stats(per_episode: list[dict]) -> dict[str, dict[str, list]]:
    """stats.json of a v2.1 sample: LeRobot's aggregation of the episodes' stats."""
    out = {}
    for name in per_episode[0] if per_episode else []:
        per = [{k: np.asarray(v) for k, v in ep[name].items()} for ep in per_episode]
        out[name] = {k: np.asarray(v).tolist() for k, v in lerobot_stats.aggregate(per).items()}
    return out
