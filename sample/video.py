"""The sample's cameras: decodable synthetic frames that carry their own dataset ``index``
(:func:`synthetic_frames`, :func:`read_frame_code`), encoded as LeRobot v3.0 does (episodes
appended to the current mp4, each on a keyframe, files rolling over by size)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core.layout.files import chunk_file, file_path, roll_over
from episodekit.core.paths import MIB, VIDEO_PATH_V3
from episodekit.core.video import VideoWriter, require_av
from episodekit.sample.spec import SampleSpec

VIDEO_CODE_BITS = 24  # frame code: the dataset ``index`` as 3 rows of 8 black/white blocks


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


def encode_file(
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


def write_camera_v30(
    root: Path, spec: SampleSpec, camera: int, lengths: np.ndarray, from_index: np.ndarray
) -> dict[str, pa.Array]:
    """Encode one camera as LeRobot v3.0 does: episodes appended to the current mp4 (each starting
    on a keyframe), a new file once the current one would pass ``video_files_size_in_mb`` (by an
    estimate that differs per camera, so cameras roll over at different episodes)."""
    key = f"observation.images.cam{camera}"
    h, w = spec.video_size
    est_bytes_per_frame = h * w * 0.05 * (1 + 0.3 * camera)
    vfile = roll_over(lengths * est_bytes_per_frame, spec.video_files_size_in_mb * MIB)
    frames_before = np.zeros(len(lengths), dtype=np.int64)
    for f in np.unique(vfile).tolist():
        sel = np.flatnonzero(vfile == f)
        frames_before[sel] = np.cumsum(lengths[sel]) - lengths[sel]
        vpath = root / file_path(VIDEO_PATH_V3, *chunk_file(f, spec.chunks_size), video_key=key)
        vpath.parent.mkdir(parents=True, exist_ok=True)
        encode_file(vpath, spec, camera, [(int(from_index[e]), int(lengths[e])) for e in sel])
    return {
        f"videos/{key}/chunk_index": pa.array(chunk_file(vfile, spec.chunks_size)[0]),
        f"videos/{key}/file_index": pa.array(chunk_file(vfile, spec.chunks_size)[1]),
        f"videos/{key}/from_timestamp": pa.array(frames_before / spec.fps),
        f"videos/{key}/to_timestamp": pa.array((frames_before + lengths) / spec.fps),
    }
