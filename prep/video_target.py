"""The random-access target ``prep videos`` aims at, and whether a probed mp4 already meets it.

A file meets the target when reading any frame at random costs at most ``gop - 1`` extra
decodes and every episode can be cut or read from its first frame:

- its codec is one the loader decodes (:data:`LOADER_CODECS`), and the one asked for when
  ``--codec`` is given;
- its keyframes are at most ``gop`` frames apart (in presentation order, the run after the last
  keyframe included), the first frame being one;
- the frame at every episode's ``from_timestamp`` is a keyframe.

CRF, pixel format and ``faststart`` are not part of it: they do not change what a random read
decodes, and re-encoding a file that already meets the target only loses quality (LeRobot's
default AV1, keyframe every 2 frames, meets it at the default ``--gop 2``). Decided from the
mp4's sample tables (:func:`episodekit.core.video.probe`): no frame is decoded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from episodekit.core.video import VideoIndex

# What the loader's PyAV backend decodes (FFmpeg's software decoders); LeRobot writes the first
# three (libsvtav1, libx264, libx265).
LOADER_CODECS = ("av1", "h264", "hevc", "vp9")


@dataclass(frozen=True)
class Target:
    """``gop``: the largest keyframe distance allowed; ``codec``: the codec required, or None
    for any of :data:`LOADER_CODECS`."""

    gop: int
    codec: str | None = None

    def describe(self) -> str:
        codec = self.codec or "a codec the loader decodes"
        return f"{codec}, keyframes <= {self.gop} frames apart and at every episode start"


def start_positions(index: VideoIndex, from_seconds: np.ndarray) -> np.ndarray:
    """The file position of the frame each episode starts on: the first frame at or after
    ``from_timestamp`` minus half a frame (the rule the video checks use)."""
    half = 0.5 / index.fps if index.fps else 0.0
    pos = np.searchsorted(index.seconds, np.asarray(from_seconds, np.float64) - half)
    return np.clip(pos, 0, max(0, index.num_frames - 1)).astype(np.int64)


def longest_gop(index: VideoIndex) -> int:
    """The most frames from one keyframe to the next (or to the end); the whole file when its
    first frame is not a keyframe."""
    keys = np.flatnonzero(index.keyframe)
    if index.num_frames == 0:
        return 0
    if len(keys) == 0 or keys[0] != 0:
        return index.num_frames
    return int(np.diff(np.append(keys, index.num_frames)).max())


def target_problem(index: VideoIndex, starts: np.ndarray, target: Target) -> str | None:
    """Why the file at ``index`` misses ``target`` (``starts``: its episodes' first frames, from
    :func:`start_positions`), or None when it meets it."""
    if target.codec is not None and index.codec != target.codec:
        return f"codec {index.codec}, --codec {target.codec} asked"
    if index.codec not in LOADER_CODECS:
        return f"codec {index.codec} is not one the loader decodes ({', '.join(LOADER_CODECS)})"
    if index.num_frames == 0:
        return "no frames"
    gop = longest_gop(index)
    if gop > target.gop:
        return f"keyframes up to {gop} frames apart (--gop {target.gop})"
    late = np.flatnonzero(~index.keyframe[starts])
    if len(late):
        at = float(index.seconds[starts[late[0]]])
        return f"{len(late)} episode(s) do not start on a keyframe (first at {at:.3f} s)"
    return None
