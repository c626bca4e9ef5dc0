"""Image/video feature stats in LeRobot's conventions (``episodekit metadata stats --images``).

What LeRobot does (``lerobot/datasets/compute_stats.py``) and what is kept here:

- per episode, frames at ``round(linspace(0, length - 1, n))`` with
  ``n = max(min(100, length), min(int(length ** 0.75), 10_000))`` (its ``sample_indices`` /
  ``estimate_num_samples``): deterministic, no random draw;
- each sampled frame as RGB uint8, strided by ``int(max side / 150)`` when its larger side is
  >= 300 pixels (``auto_downsample_height_width``, the stride taken from width when wider);
- per channel over every pixel of the sampled frames: ``min, max, mean, std`` (population) and
  ``q01 .. q99``, divided by 255 (values in [0, 1]), stored with shape ``(3, 1, 1)``; ``count``
  is ``[number of sampled frames]`` (LeRobot's count for images), dataset count their sum;
- dataset stats over all sampled pixels of all episodes (what LeRobot's counts-weighted merge
  gives for mean/std/min/max).

Differences, on purpose: quantiles are exact (numpy's "linear" rule over the sampled pixels,
through per-channel 256-bin pixel histograms, which also merge exactly: dataset quantiles are
those of all sampled pixels, not LeRobot's histogram estimate or its min/max envelope of the
episodes' quantiles). Video frames are the decoded mp4 frames (our PyAV path, FFmpeg's default
YUV->RGB, the frame closest to ``from_timestamp + timestamp`` within 1e-4 s), where LeRobot's
recorder measured the frames before encoding: lossy coding moves values by a few levels.
Image features stored in parquet (``struct{bytes, path}``) are decoded with Pillow (the
``[images]`` extra). Depth maps are left as they are.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.dataset import Dataset, DatasetError
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.executor import map_files
from episodekit.core.parquet_read import open_data_file, read_table
from episodekit.core.paths import UnsafePathError, inside_root
from episodekit.core.video import VideoFile, require_av
from episodekit.metadata.lerobot_image_stats import (  # noqa: F401 - also this module's API
    DOWNSAMPLE_TARGET,
    DOWNSAMPLE_THRESHOLD,
    MAX_SAMPLES,
    MIN_SAMPLES,
    SAMPLE_POWER,
    downsample_step,
    estimate_num_samples,
    sample_indices,
)

IMAGE_DTYPES = ("image", "video")
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = ("q01", "q10", "q50", "q90", "q99")
TOLERANCE_S = 1e-4  # LeRobot's default tolerance between a query and the decoded frame
CHUNK_FRAMES = 32  # sampled frames decoded per step (bounds memory at any resolution)
PIL_HINT = "image features need Pillow: pip install 'episodekit[images]' (or: pip install pillow)"
SAMPLING = (
    "LeRobot's sample_indices: per episode frames round(linspace(0, length-1, n)), "
    "n = max(min(100, length), min(int(length**0.75), 10000)); frames with a side >= 300 px "
    "strided by int(larger side / 150); RGB uint8 / 255; quantiles exact (linear rule) over "
    "the sampled pixels; count = sampled frames"
)


def is_depth_map(feature: dict) -> bool:
    """LeRobot's flag: ``info.is_depth_map`` or the legacy ``video.is_depth_map``."""
    info = feature.get("info") or feature.get("video_info") or {}
    return bool(info.get("is_depth_map") or info.get("video.is_depth_map"))


def image_features(info: dict) -> dict[str, str]:
    """``{name: dtype}`` of the image/video features stats are computed for (no depth maps)."""
    out = {}
    for name, f in (info.get("features") or {}).items():
        if isinstance(f, dict) and f.get("dtype") in IMAGE_DTYPES and not is_depth_map(f):
            out[name] = f["dtype"]
    return out


def require_decoders(info: dict) -> None:
    """Fail early (``EnvironmentProblem``, exit 2) when a decoder the features need is missing."""
    dtypes = set(image_features(info).values())
    if "video" in dtypes:
        require_av()
    if "image" in dtypes:
        _require_pil()


def _require_pil():
    try:
        from PIL import Image
    except ImportError as exc:  # a third-party optional dependency
        raise EnvironmentProblem(PIL_HINT) from exc
    return Image


def pixel_histogram(frames: np.ndarray) -> np.ndarray:
    """``(C, 256)`` counts of each uint8 value per channel of ``(N, H, W, C)`` frames, after
    LeRobot's downsampling stride."""
    s = downsample_step(frames.shape[1], frames.shape[2])
    frames = frames[:, ::s, ::s]
    return np.stack(
        [np.bincount(frames[..., c].ravel(), minlength=256) for c in range(frames.shape[-1])]
    ).astype(np.int64)


def stats_from_histogram(hist: np.ndarray) -> dict[str, np.ndarray]:
    """``min, max, mean, std, q01..q99`` (values / 255) over ``(..., C, 256)`` histograms."""
    hist = hist.astype(np.int64)
    v = np.arange(256, dtype=np.float64)
    n = hist.sum(-1)
    safe = np.maximum(n, 1)
    out: dict[str, np.ndarray] = {
        "min": np.argmax(hist > 0, axis=-1).astype(np.float64),
        "max": 255.0 - np.argmax(hist[..., ::-1] > 0, axis=-1),
    }
    mean = (hist * v).sum(-1) / safe
    out["mean"] = mean
    out["std"] = np.sqrt(np.maximum((hist * (v - mean[..., None]) ** 2).sum(-1) / safe, 0.0))
    cum = np.cumsum(hist, axis=-1)
    for key, q in zip(QUANTILE_KEYS, QUANTILES):
        h = (n - 1) * q
        k0 = np.floor(h).astype(np.int64)
        k1 = np.minimum(k0 + 1, np.maximum(n - 1, 0))
        g = h - k0
        a = (cum <= k0[..., None]).sum(-1).astype(np.float64)  # value of order statistic k0
        b = (cum <= k1[..., None]).sum(-1).astype(np.float64)
        diff = b - a
        out[key] = np.where(g >= 0.5, b - diff * (1 - g), a + diff * g)  # numpy's _lerp
    return {k: x / 255.0 for k, x in out.items()}


@dataclass
class ImageStats:
    """Pixel histograms of the sampled frames of each image/video feature, per episode."""

    episode_index: np.ndarray  # sorted, as the numeric StatsResult
    samples: np.ndarray  # sampled frames per episode
    hist: dict[str, np.ndarray]  # feature -> (episodes, C, 256) int64
    fingerprint: str = ""
    dtypes: dict[str, str] = field(default_factory=dict)

    def episode_stats(self, name: str) -> dict[str, np.ndarray]:
        """``{key: (episodes, C)}`` (count excluded)."""
        return stats_from_histogram(self.hist[name])

    def lerobot_stats(self) -> dict[str, dict[str, list]]:
        """stats.json entries: shape (C, 1, 1) lists, ``count`` ``[sampled frames]``."""
        out = {}
        for name, h in self.hist.items():
            s = stats_from_histogram(h.sum(0))
            entry = {k: s[k].reshape(-1, 1, 1).tolist() for k in ("min", "max", "mean", "std")}
            entry["count"] = [int(self.samples.sum())]
            entry.update({k: s[k].reshape(-1, 1, 1).tolist() for k in QUANTILE_KEYS})
            out[name] = entry
        return out

    def episode_columns(self, pos: np.ndarray) -> dict[str, pa.Array]:
        """``stats/{feature}/{key}`` columns for episodes at positions ``pos``: ``(C, 1, 1)``
        nested lists of doubles (what LeRobot's recorder writes), count ``list<int64>``."""
        cols: dict[str, pa.Array] = {}
        for name in self.hist:
            s = self.episode_stats(name)
            for key in ("min", "max", "mean", "std", "count", *QUANTILE_KEYS):
                if key == "count":
                    cols[f"stats/{name}/count"] = pa.array(
                        self.samples[pos][:, None].tolist(), pa.list_(pa.int64())
                    )
                    continue
                x = s[key][pos]  # (E, C)
                cols[f"stats/{name}/{key}"] = pa.array(
                    x[:, :, None, None].tolist(), pa.list_(pa.list_(pa.list_(pa.float64())))
                )
        return cols

    def meta(self) -> dict:
        """What the summary file records about these stats."""
        return {
            "features": dict(self.dtypes),
            "fingerprint": self.fingerprint,
            "sampling": SAMPLING,
            "sampled_frames": int(self.samples.sum()),
        }


def _sample_plan(
    ds: Dataset, episodes: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """(sorted episode indices, their rows in ``ds.episodes``, each one's sampled frames), of
    every episode or of ``episodes``."""
    ep = ds.column("episode_index")
    order = np.argsort(ep, kind="stable")
    if episodes is not None:
        order = order[np.isin(ep[order], np.asarray(episodes))]
    length = ds.column("length")[order]
    return ep[order], order, [sample_indices(int(n)) for n in length]


def _sampled_timestamps(ds: Dataset, rows: np.ndarray, picks: list[np.ndarray]) -> list:
    """The data's ``timestamp`` of each sampled frame (what the loader queries the video at)."""
    start = ds.column("dataset_from_index")[rows]
    want = np.concatenate([s + p for s, p in zip(start, picks)]) if picks else np.zeros(0)
    ts = np.full(len(want), np.nan)
    for f in sorted(set(ds.column("file_id")[rows].tolist())):  # the files holding them
        t = read_table(ds.fs, ds.data_path(f), columns=["index", "timestamp"])
        idx = t["index"].to_numpy()
        if not len(idx):
            continue
        pos = np.minimum(np.searchsorted(idx, want), len(idx) - 1)
        hit = idx[pos] == want
        ts[hit] = t["timestamp"].to_numpy().astype(np.float64)[pos[hit]]
    if np.isnan(ts).any():
        raise DatasetError("sampled frames missing from the data files (index column)")
    return np.split(ts, np.cumsum([len(p) for p in picks])[:-1])


def scan_video(job: dict) -> dict[int, np.ndarray]:
    """One mp4 of one camera: ``{episode position: (C, 256) histogram}`` of its sampled frames."""
    vf = VideoFile(job["path"], threads=1)
    out = {}
    try:
        for i, seconds in job["episodes"]:
            h = np.zeros((3, 256), np.int64)
            for a in range(0, len(seconds), CHUNK_FRAMES):
                part = vf.read_seconds(seconds[a : a + CHUNK_FRAMES], TOLERANCE_S)
                h += pixel_histogram(np.stack(part))
            out[i] = h
    finally:
        vf.close()
    return out


def scan_images(job: dict) -> dict[int, np.ndarray]:
    """One data file, one image feature: ``{episode position: (C, 256)}`` of its sampled frames,
    read batch by batch (only sampled rows kept), bytes decoded with Pillow; a row with only a
    ``path`` opens that file, which must lie inside the root (hub data is untrusted)."""
    image = _require_pil()
    owner = {int(r): i for i, want in job["episodes"] for r in np.asarray(want).tolist()}
    keys = np.array(sorted(owner), dtype=np.int64)
    out: dict[int, np.ndarray] = {i: np.zeros((3, 256), np.int64) for i, _ in job["episodes"]}
    with open_data_file(job["file"]) as df:
        for batch in df.batches(4096, ["index", job["feature"]]):
            idx = batch.column(0).to_numpy()
            sel = np.flatnonzero(np.isin(idx, keys))
            if not len(sel):
                continue
            col = batch.column(1).take(pa.array(sel))
            blobs = pc.struct_field(col, "bytes").to_pylist()
            paths = pc.struct_field(col, "path").to_pylist()
            for r, b, p in zip(idx[sel].tolist(), blobs, paths):
                b = image_bytes(b, p, job["root"], f"{job['file']}: {job['feature']} (index {r})")
                with image.open(io.BytesIO(b)) as im:
                    out[owner[r]] += pixel_histogram(np.asarray(im.convert("RGB"))[None])
    return out


def image_bytes(blob: bytes | None, path: str | None, root: str, where: str) -> bytes:
    """The bytes of one image cell (``struct{bytes, path}``): its bytes, else the file its
    ``path`` names, which must lie inside ``root`` (hub data is untrusted); ``where`` names the
    file, feature and row in the error."""
    if blob is not None:
        return blob
    if path is None:
        raise DatasetError(f"{where}: image with neither bytes nor path")
    try:
        safe = inside_root(root, path)
    except UnsafePathError as exc:  # name the file, feature and row at fault
        raise UnsafePathError(f"{where}: {exc}") from None
    with open(safe, "rb") as fh:
        return fh.read()


def compute_image_stats(
    ds: Dataset,
    executor: str = "local",
    jobs: int | None = None,
    episodes: np.ndarray | None = None,
) -> ImageStats | None:
    """Pixel histograms of the sampled frames of every image/video feature (None: there are
    none), of every episode or only of ``episodes`` (an edit's episodes cut inside). Videos:
    one job per mp4 (its episodes in timestamp order, one decoder); images in parquet: one job
    per data file."""
    feats = image_features(ds.info)
    if not feats:
        return None
    require_decoders(ds.info)
    if not ds.is_local:
        raise EnvironmentProblem("--images decodes local files: copy the root first")
    ep, rows, picks = _sample_plan(ds, episodes)
    samples = np.array([len(p) for p in picks], dtype=np.int64)
    hist = {n: np.zeros((len(ep), 3, 256), np.int64) for n in feats}
    videos = [n for n, d in feats.items() if d == "video"]
    if videos:
        ts = _sampled_timestamps(ds, rows, picks)
        for name in videos:
            chunk = ds.column(f"videos/{name}/chunk_index")[rows]
            fidx = ds.column(f"videos/{name}/file_index")[rows]
            start = ds.column(f"videos/{name}/from_timestamp")[rows].astype(np.float64)
            groups: dict[tuple[int, int], list] = {}
            for i in np.argsort(start, kind="stable"):
                key = (int(chunk[i]), int(fidx[i]))
                groups.setdefault(key, []).append((int(i), start[i] + ts[i]))
            todo = [
                {"path": ds.safe_join(ds.video_path(name, c, f)), "episodes": eps}
                for (c, f), eps in sorted(groups.items())
            ]
            for part in map_files(scan_video, todo, executor, jobs):
                for i, h in part.items():
                    hist[name][i] = h
    images = [n for n, d in feats.items() if d == "image"]
    if images:
        file_id = ds.column("file_id")[rows]
        start = ds.column("dataset_from_index")[rows]
        for name in images:
            todo = []
            for f in sorted(set(file_id.tolist())):
                sel = np.flatnonzero(file_id == f)
                todo.append(
                    {
                        "file": ds.data_path(f),
                        "feature": name,
                        "episodes": [(int(i), start[i] + picks[i]) for i in sel],
                        "root": ds.path,
                    }
                )
            for part in map_files(scan_images, todo, executor, jobs):
                for i, h in part.items():
                    hist[name][i] = h
    return ImageStats(ep, samples, hist, ds.fingerprint, feats)


__all__ = [
    "ImageStats",
    "compute_image_stats",
    "downsample_step",
    "estimate_num_samples",
    "image_features",
    "require_decoders",
    "sample_indices",
    "stats_from_histogram",
]
