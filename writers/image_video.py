"""``edit --images-to-video``: image features stored in the data parquet (``struct{bytes, path}``
per frame) encoded as video files, laid out as LeRobot 0.6.1's ``convert_image_to_video_dataset``
lays them out, and verified frame by frame before anything is published.

What LeRobot does, and what is kept:

- the encoder of its ``rgb_encoder_defaults()``: libsvtav1 (AV1), ``yuv420p``, GOP 2, CRF 30,
  preset 12, fast-decode 0; each image as Pillow's ``convert("RGB")`` of its bytes;
- files ``videos/KEY/chunk-XXX/file-YYY.mp4``, episodes in output order, a new file once the
  current one reaches ``video_files_size_in_mb``; per episode ``videos/KEY/chunk_index``,
  ``file_index``, ``from_timestamp`` and ``to_timestamp`` (seconds inside its file);
- ``info.json``: the feature's ``dtype`` becomes ``video`` with LeRobot 0.6.1's ``info`` block
  (``video.height`` ... ``is_depth_map``), and ``video_path`` is set;
- the image column leaves the data files (and their ``huggingface`` schema metadata).

Differences, on purpose: every episode starts on a keyframe and frame ``n`` of a file sits at
``n * 512`` ticks of ``1/(fps*512)`` (what LeRobot's recorder writes; its converter encodes a batch
of episodes as one stream, so an episode may start between keyframes); prediction is low-delay
(no reordered frames, as in the recorder's files); the feature's stats are kept, not dropped
(LeRobot computes image stats from the images before encoding, as its recorder does for video:
shape ``(3, 1, 1)``), and recomputed from the decoded video when frames are cut.

Verification (:func:`verify_encoded`): each written mp4 is read back whole: its frame count,
every frame's pts, a keyframe at each episode start, and every decoded frame against its source
image decoded again, converted as the encoder converted it (``yuv420p``): at least
``MIN_PSNR_DB`` PSNR per frame, else nothing is published. The worst frame is also measured in
RGB (FFmpeg's default YUV->RGB, as LeRobot's pyav path) against the image, for the report. Depth
maps are refused (LeRobot encodes them as 12-bit HEVC after quantizing).
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.dataset import Dataset
from episodekit.core.errors import DatasetError
from episodekit.core.layout.files import chunk_file, file_path
from episodekit.core.paths import MIB, VIDEO_PATH_V3
from episodekit.core.progress import current
from episodekit.core.video import psnr_db  # noqa: F401 - also this module's API
from episodekit.core.video_writer import LEROBOT_RGB  # noqa: F401 - also this module's API
from episodekit.writers.plan import OutputPlan

ALL = "all"  # --images-to-video without a KEY: every image feature
# LeRobot 0.6.1's rgb_encoder_defaults() (lerobot/configs/video.py), LEROBOT_RGB's settings
ENCODER_INFO = {
    "video.g": 2,
    "video.crf": 30,
    "video.preset": 12,
    "video.fast_decode": 0,
    "video.video_backend": "pyav",
    "video.extra_options": {},
}
# Every decoded frame against what the encoder was given (its image in yuv420p): the codec's
# loss. A floor that catches a broken, truncated or misplaced stream, not a quality target:
# LeRobot's CRF 30 measured 32.5 dB on heavy noise, 36.8 dB on a 96x128 photo, 44.6 dB on the
# recorder fixture (docs/surgery.md, scripts/probe_image_video_psnr.py).
MIN_PSNR_DB = 30.0
BATCH_ROWS = 256  # image rows decoded per read (a 640x480 PNG is ~300 KB)


def chosen_keys(ds: Dataset, requested: Sequence[str], removed: Sequence[str] = ()) -> tuple:
    """The image features ``--images-to-video`` encodes (``all``: every one), in feature order;
    ValueError naming the first bad request."""
    from episodekit.metadata.image_stats import is_depth_map

    if not requested:
        return ()
    images = [k for k, f in ds.features.items() if f.get("dtype") == "image"]
    if ALL in requested:
        if not images:
            raise ValueError(f"--images-to-video: {ds.root} has no image feature stored in parquet")
        want = set(images) - set(removed)
    else:
        want = set(requested)
    for k in sorted(want):
        where = f"--images-to-video {k}"
        if k not in ds.features:
            raise ValueError(f"{where}: no such feature (image features: {images or 'none'})")
        dtype = ds.features[k].get("dtype")
        if dtype != "image":
            raise ValueError(
                f"{where}: a {dtype} feature, not images in parquet "
                f"(image features: {images or 'none'})"
            )
        if k in removed:
            raise ValueError(f"{where}: also given to --remove-feature")
        if is_depth_map(ds.features[k]):
            raise ValueError(f"{where}: a depth map (LeRobot encodes those as 12-bit HEVC)")
    from episodekit.core.video import require_av

    require_av()  # before anything is written: the encoder and Pillow are there
    _pil()
    return tuple(k for k in ds.features if k in want)


@dataclass
class Encoded:
    """What the encoding wrote: the episodes' ``videos/*`` columns, per key the files (relative
    path -> output episode positions, in order) and the frame size (height, width)."""

    keys: tuple[str, ...]
    columns: dict[str, pa.Array] = field(default_factory=dict)
    files: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    # set by verify_encoded: the worst frame's PSNR (dB) against its encoder input (codec) and
    # against its source image in RGB (what LeRobot's loader returns: 4:2:0 chroma included)
    min_psnr_db: float | None = None
    min_rgb_psnr_db: float | None = None
    psnr: dict[str, tuple[float, float]] = field(default_factory=dict)  # the same, per key

    def frame_counts(self, plan: OutputPlan) -> dict[str, dict[str, int]]:
        """``{key: {rel: frames}}`` (what :func:`~episodekit.writers.verify.verify_videos`
        checks)."""
        return {
            k: {rel: int(plan.length[pos].sum()) for rel, pos in files.items()}
            for k, files in self.files.items()
        }

    def features(self, features: dict, fps: float) -> dict:
        """The output features with each encoded key declared as LeRobot 0.6.1 declares video."""
        out = dict(features)
        for k in self.keys:
            h, w = self.sizes[k]
            f = {**features[k], "dtype": "video"}
            f["info"] = {
                "video.height": h,
                "video.width": w,
                "video.codec": "av1",
                "video.pix_fmt": LEROBOT_RGB.pix_fmt,
                "video.fps": int(fps),
                "video.channels": 3,
                "has_audio": False,
                **ENCODER_INFO,
                "is_depth_map": False,
            }
            out[k] = f
        return out

    def summary(self, plan: OutputPlan) -> dict:
        def db(x: float | None) -> float | None:
            return None if x is None or x == float("inf") else round(x, 2)

        return {
            "features": list(self.keys),
            "frames": plan.num_frames,
            "video_files": sum(len(v) for v in self.files.values()),
            "encoder": "libsvtav1 yuv420p gop 2 crf 30 preset 12 (LeRobot 0.6.1's defaults)",
            "min_psnr_db": db(self.min_psnr_db),
            "min_rgb_psnr_db": db(self.min_rgb_psnr_db),
            "cameras": {
                k: {"frames": plan.num_frames, "min_psnr_db": db(q), "min_rgb_psnr_db": db(r)}
                for k, (q, r) in self.psnr.items()
            },
        }


def _pil():
    from episodekit.metadata.image_stats import _require_pil

    return _require_pil()


def source_frames(plan: OutputPlan, key: str) -> Iterator[tuple[int, np.ndarray]]:
    """``(output episode position, RGB uint8 frame)`` of every kept frame of image feature
    ``key``, in output order: each source file's rows streamed once (only ``episode_index``,
    ``frame_index`` and ``key``; row groups without a kept episode skipped)."""
    from episodekit.core.parquet_read import open_data_file
    from episodekit.metadata.image_stats import image_bytes
    from episodekit.writers.data import _row_groups

    image = _pil()
    run_key = plan.ds_id.astype(np.int64) * (1 << 32) + plan.src_file
    cuts = np.flatnonzero(run_key[1:] != run_key[:-1]) + 1
    for run in np.split(np.arange(plan.num_episodes), cuts):
        d, f = int(plan.ds_id[run[0]]), int(plan.src_file[run[0]])
        ds = plan.datasets[d]
        keep = plan.src_episode[run]
        path = ds.data_path(f)
        seen = np.zeros(len(run), dtype=np.int64)  # source rows read per episode
        last = 0
        cols = ["episode_index", "frame_index", key]
        with open_data_file(path, ds.fs, stream=True) as df:
            for batch in df.batches(BATCH_ROWS, cols, _row_groups(plan, d, f, keep)):
                ep = batch.column("episode_index").to_numpy()
                k = np.clip(np.searchsorted(keep, ep), 0, len(keep) - 1)
                sel = np.flatnonzero(keep[k] == ep)
                if not len(sel):
                    continue
                k = k[sel]
                fi = batch.column("frame_index").to_numpy()[sel]
                col = batch.column(key).take(pa.array(sel))
                blobs = pc.struct_field(col, "bytes").to_pylist()
                paths = pc.struct_field(col, "path").to_pylist()
                for j, (kj, fj) in enumerate(zip(k.tolist(), fi.tolist())):
                    if kj < last or fj != seen[kj]:
                        raise DatasetError(
                            f"{key}: episode {int(keep[kj])}'s rows are not in frame order "
                            f"(frame_index {fj} where {int(seen[kj])} was next)",
                            path,
                        )
                    last, seen[kj] = kj, seen[kj] + 1
                    mask = plan.frames.get(int(run[kj]))
                    if mask is not None and (fj >= len(mask) or not mask[fj]):
                        continue  # a row past the episode's end: counted, reported below
                    where = f"{path}: {key} (episode {int(keep[kj])} frame {fj})"
                    data = image_bytes(blobs[j], paths[j], ds.path, where)
                    try:
                        with image.open(io.BytesIO(data)) as im:
                            rgb = np.asarray(im.convert("RGB"))
                    except (OSError, ValueError) as exc:
                        raise DatasetError(f"{key}: episode {int(keep[kj])} frame {fj}: {exc}",
                                           path) from None  # fmt: skip
                    yield int(run[kj]), rgb
        short = np.flatnonzero(seen != [len(plan.frames[p]) if p in plan.frames
                                        else plan.length[p] for p in run.tolist()])  # fmt: skip
        if len(short):
            i = int(short[0])
            raise DatasetError(
                f"{key}: episode {int(keep[i])} has {int(seen[i])} rows, the episodes table "
                f"says {int(plan.length[run[i]])}",
                path,
            )


MIN_SIDE = 4  # libsvtav1 refuses a smaller width or height


def _writer(path: Path, shape: tuple, fps: float, key: str):
    from episodekit.core.video_writer import VideoWriter

    h, w = int(shape[0]), int(shape[1])
    if min(h, w) < MIN_SIDE:
        raise ValueError(
            f"--images-to-video {key}: {w}x{h} images; libsvtav1 (LeRobot's AV1) needs at least "
            f"{MIN_SIDE}x{MIN_SIDE}"
        )
    return VideoWriter(path, w, h, int(round(fps)), LEROBOT_RGB)


def encode_images(
    plan: OutputPlan,
    staging: Path,
    keys: Sequence[str],
    info: dict,
    chunks_size: int,
    executor: str = "local",
) -> Encoded:
    """Encode every kept frame of each of ``keys`` into mp4 files under ``staging`` (see the
    module docstring): one job per feature, in this process (``executor="local"``) or as Ray
    tasks (``"ray"``: ``staging`` on a filesystem every node mounts); frame by frame, so memory
    is a batch of images whatever the episode."""
    from episodekit.core.executor import imap_files

    limit = float(info.get("video_files_size_in_mb") or 200) * MIB
    out = Encoded(tuple(keys))
    current().step(f"encoding {', '.join(keys)} as video (AV1, LeRobot's defaults)")
    shared = (plan, str(staging), limit, chunks_size)
    workers = 1 if executor == "local" else None
    for i, part in imap_files(_encode_key, list(keys), executor, workers, shared=shared):
        key = keys[i]
        out.sizes[key], out.files[key] = part["size"], part["files"]
        out.columns.update(part["columns"])
    out.columns = {  # one order, whatever order the jobs finished in
        f"videos/{k}/{c}": out.columns[f"videos/{k}/{c}"]
        for k in keys
        for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
    }
    return out


def _encode_key(key: str, shared: tuple) -> dict:
    """One image feature's video files (an executor job): size, files and ``videos/*``
    columns."""
    from episodekit.core.video import require_av

    plan, staging, limit, chunks_size = shared
    staging = Path(staging)
    fps = float(plan.datasets[0].fps)
    av = require_av()
    seq = np.full(plan.num_episodes, -1, dtype=np.int64)
    new_from = np.zeros(plan.num_episodes)
    new_to = np.zeros(plan.num_episodes)
    writer, file_no, in_file, pos_now, size = None, -1, 0, -1, None
    try:
        for pos, rgb in source_frames(plan, key):
            if size is None:
                size = rgb.shape[:2]
            if rgb.shape[:2] != size:
                raise DatasetError(
                    f"{key}: episode {int(plan.src_episode[pos])} has a "
                    f"{rgb.shape[1]}x{rgb.shape[0]} image, the first was {size[1]}x{size[0]} "
                    "(one video stream needs one size)"
                )
            first = pos != pos_now
            if first:  # an episode starts: in this file, or a new one past the limit
                if writer is None or writer.bytes >= limit:
                    if writer is not None:
                        writer.close()
                    file_no, in_file = file_no + 1, 0
                    rel = _relpath(key, file_no, chunks_size)
                    (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                    writer = _writer(staging / rel, size, fps, key)
                seq[pos], new_from[pos], pos_now = file_no, in_file / fps, pos
            try:
                writer.write(rgb[None], keyframe_first=first)  # type: ignore[union-attr]
            except av.error.FFmpegError as exc:  # the encoder refused these frames
                msg = f"--images-to-video {key}: libsvtav1 cannot encode {size[1]}x{size[0]}"
                raise ValueError(f"{msg} images ({exc})") from None
            in_file += 1
            new_to[pos] = in_file / fps
        if writer is not None:
            writer.close()
            writer = None
    finally:
        if writer is not None:  # an error half-way: the staging folder is discarded
            writer.abort()
    if (seq < 0).any():
        e = int(plan.src_episode[np.flatnonzero(seq < 0)[0]])
        raise DatasetError(f"{key}: episode {e} has no image to encode")
    return {
        "size": (int(size[0]), int(size[1])),  # type: ignore[index]
        "files": {
            _relpath(key, s, chunks_size): np.flatnonzero(seq == s) for s in np.unique(seq).tolist()
        },
        "columns": {
            f"videos/{key}/chunk_index": pa.array(chunk_file(seq, chunks_size)[0]),
            f"videos/{key}/file_index": pa.array(chunk_file(seq, chunks_size)[1]),
            f"videos/{key}/from_timestamp": pa.array(new_from),
            f"videos/{key}/to_timestamp": pa.array(new_to),
        },
    }


def _relpath(key: str, file_no: int, chunks_size: int) -> str:
    return file_path(VIDEO_PATH_V3, *chunk_file(file_no, chunks_size), video_key=key)


def planes(frame) -> np.ndarray:
    """Every sample of an 8-bit planar frame (Y, then U and V: ``(w + 1) // 2`` wide at an odd
    width), flat: what PyAV's ``to_ndarray`` gives for an even size, which it refuses for an
    odd one (libsvtav1 encodes odd sizes, as LeRobot's recorder asks for them)."""
    out = []
    for p in frame.planes:
        rows = np.frombuffer(p, dtype=np.uint8).reshape(p.height, p.line_size)
        out.append(rows[:, : p.width].ravel())
    return np.concatenate(out)


def verify_encoded(staging: Path, plan: OutputPlan, enc: Encoded, executor: str = "local") -> None:
    """Read every written mp4 back (see the module docstring; one job per feature, as they were
    written) and set ``enc``'s worst PSNRs; :class:`VerificationError` naming the file and the
    first frame at fault."""
    from episodekit.core.executor import imap_files

    shared = (plan, str(staging), enc.files)
    workers = 1 if executor == "local" else None
    worst, worst_rgb = float("inf"), float("inf")
    for i, (q, r) in imap_files(_verify_key, list(enc.keys), executor, workers, shared=shared):
        worst, worst_rgb = min(worst, q), min(worst_rgb, r)
        enc.psnr[enc.keys[i]] = (q, r)
    enc.psnr = {k: enc.psnr[k] for k in enc.keys}  # feature order, whatever order jobs ended
    enc.min_psnr_db, enc.min_rgb_psnr_db = worst, worst_rgb


def _verify_key(key: str, shared: tuple) -> tuple[float, float]:
    """One feature's files read back (an executor job): its worst frame's PSNR against the
    encoder's input and in RGB against the image."""
    from episodekit.core.mp4 import mp4_sample_table
    from episodekit.core.parquet_write import VerificationError
    from episodekit.core.video import require_av
    from episodekit.core.video_writer import ticks_per_frame

    plan, staging, files = shared
    staging = Path(staging)
    av = require_av()
    worst, worst_rgb = float("inf"), float("inf")
    frames = source_frames(plan, key)
    # one conversion context each way (a new one per frame costs ~5x), FFmpeg's default
    # conversion as frame.reformat's
    to_yuv, to_rgb = (av.video.reformatter.VideoReformatter() for _ in range(2))
    for rel, pos in files[key].items():
        lengths = plan.length[pos]
        n = int(lengths.sum())
        with open(staging / rel, "rb") as fh:
            table = mp4_sample_table(fh, rel, with_bytes=False)
        pts = np.asarray(table.pts) if table is not None else np.zeros(0)
        if len(pts) != n:
            raise VerificationError(f"{rel}: {len(pts)} frames, its episodes have {n}")
        ticks = ticks_per_frame(round(plan.datasets[0].fps))
        if not np.array_equal(pts - pts[0], np.arange(n) * ticks):
            raise VerificationError(f"{rel}: frames are not 1/fps apart, in order, from 0")
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        if not np.asarray(table.keyframe)[starts].all():  # type: ignore[union-attr]
            raise VerificationError(f"{rel}: an episode does not start on a keyframe")
        j = 0
        with av.open(str(staging / rel)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                p, src = next(frames)
                given = av.VideoFrame.from_ndarray(src, format="rgb24")
                given = planes(to_yuv.reformat(given, format=frame.format.name, threads=1))
                got = planes(frame)
                q = psnr_db(got, given) if got.shape == given.shape else 0.0
                if q < MIN_PSNR_DB:
                    e = int(plan.src_episode[p])
                    raise VerificationError(
                        f"{rel}: frame {j} (source episode {e}) decodes {q:.1f} dB PSNR "
                        f"from its image in {frame.format.name} (< {MIN_PSNR_DB:g})"
                    )
                worst = min(worst, q)
                rgb = to_rgb.reformat(frame, format="rgb24", threads=1).to_ndarray()
                worst_rgb = min(worst_rgb, psnr_db(rgb, src))
                j += 1
        if j != n:
            raise VerificationError(f"{rel}: {j} frames decoded, its episodes have {n}")
    return worst, worst_rgb


__all__ = ["ALL", "Encoded", "chosen_keys", "encode_images", "psnr_db", "verify_encoded"]
