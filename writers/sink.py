"""The episode sink: episodes in, one at a time, a LeRobot v3.0 root out (what ``import`` writes).

An episode is a :class:`~episodekit.importers.mapping.MappedEpisode`: per feature a ``(T,)`` or
``(T, D)`` numpy array in the output dtype, per camera its images (encoded here), one task per
frame. :class:`EpisodeSink` writes into a folder (the caller's staging folder):

- data: ``data/chunk-XXX/file-YYY.parquet`` in LeRobot's column order and schema
  (:func:`~episodekit.writers.repair_schema.data_schema`), through
  :class:`~episodekit.writers.sink_data.DataFiles` (the sample writer's data files too): row
  groups and encoding by a :class:`~episodekit.writers.sink_data.DataPolicy` (here about
  ``target_mb``, 32 MiB, of rows written as they fill: statistics, page index), a new file
  when LeRobot's roll-over rule says (:func:`~episodekit.core.layout.files.roll_over`, on the
  episodes' Arrow bytes);
- videos: each camera's episodes in ``videos/KEY/chunk-XXX/file-YYY.mp4``, every episode
  starting on a keyframe, with LeRobot 0.6.1's encoder settings (AV1 libsvtav1, g 2, crf 30,
  yuv420p, preset 12: :data:`~episodekit.writers.image_video.LEROBOT_RGB`) or h264; a new file
  once the current one reached ``video_files_size_in_mb``. Each camera is decoded, encoded and
  its image stats computed in a process of its own (:mod:`~episodekit.writers.camera_encoder`),
  up to :data:`AHEAD_BYTES` / :data:`AHEAD_EPISODES` behind the reading: an episode's metadata
  row is written once its cameras answered (same bytes as encoding here, in any ``--jobs``);
- ``meta/episodes`` (LeRobot's rows: :func:`~episodekit.writers.repair_schema.episode_row`, with
  LeRobot's per-episode stats: sampled and downsampled frames for cameras), the episodes'
  kept source values as extra columns, ``meta/tasks.parquet``, ``meta/info.json`` (parsed
  strictly through :class:`~episodekit.core.layout.Info`) and ``meta/stats.json`` (the
  surgery writer's: LeRobot's aggregation, quantiles exact over the written columns).

:meth:`EpisodeSink.finish` then verifies the folder: every data file read back against the
checksums of the rows meant for it (row counts, ``index``), each mp4's frame count against its
episodes, the root read back as a dataset. Memory: one episode and one row group's rows (about
``target_mb``), plus what reading a data file back costs, plus per camera its process (numpy
and PyAV, ~66 MiB) and the frames in flight to it; the episodes' metadata rows and sketch
points go to disk every 256 episodes (:mod:`~episodekit.writers.import_parts`), the dataset
quantiles are exact by range counts over the written files
(:mod:`~episodekit.writers.stats_exact`); the metadata files are written by the sink's metadata
side (:mod:`~episodekit.writers.sink_meta`, policy ``IMPORT``). A checkpoint's read-back (with
the cameras alive) goes through small column buffers, Arrow's pool released after each batch:
peak 1.07x from 1,000 to 4,000 episodes of 100 steps (docs/import.md).

Checkpoints (resuming a killed import): when a data file is full, it is closed, read back
and checked, the cameras' mp4s are closed with it (the next episode starts new ones) and the
episodes' parts written; :meth:`EpisodeSink.state` then describes everything kept (JSON), and
:meth:`EpisodeSink.restore` on a new sink over the same folder carries on from there (the
caller journals it: :mod:`~episodekit.writers.import_run`). Closing the mp4s with the data
file is what lets one episode boundary end every file at once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core.errors import DatasetError
from episodekit.core.layout.files import chunk_file
from episodekit.core.layout.rules import DATA_PATH_V3, VIDEO_PATH_V3
from episodekit.core.paths import MIB
from episodekit.importers.mapping import MappedEpisode
from episodekit.metadata.stats import numeric_features
from episodekit.writers import meta as meta_mod
from episodekit.writers import repair_schema, sink_meta
from episodekit.writers.camera_encoder import Camera, CameraProcess
from episodekit.writers.import_parts import EpisodeParts
from episodekit.writers.sink_data import DataFiles, DataPolicy

DEFAULT_COLUMNS = {  # LeRobot's DEFAULT_FEATURES, after the dataset's own
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
CODECS = {"av1": "libsvtav1", "h264": "libx264"}
# Frames handed to a camera's encoding process and not encoded yet, at most (more episodes
# ahead only while these stay under both): the reading runs ahead of the encoders by that much.
AHEAD_BYTES = 64 * MIB
AHEAD_EPISODES = 8


@dataclass(frozen=True)
class SinkFeature:
    """One output feature: ``kind`` ``array`` (dtype, shape ``(D,)``, names) or ``image``
    (shape ``(H, W, C)``, encoded as ``video`` ``av1`` or ``h264``)."""

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    names: tuple[str, ...] | None = None
    video: str = "av1"


@dataclass
class SinkResult:
    """What the sink wrote."""

    episodes: int = 0
    frames: int = 0
    tasks: int = 0
    data_files: int = 0
    video_files: int = 0
    features: list[str] = field(default_factory=list)


class EpisodeSink:
    """Write episodes (in order) as a v3.0 root in ``folder`` (see the module docstring)."""

    def __init__(
        self,
        folder: str | Path,
        features: list[SinkFeature],
        fps: int,
        robot_type: str | None = None,
        chunks_size: int = 1000,
        data_mb: float = 100.0,
        video_mb: float = 200.0,
        target_mb: float = 32.0,
    ) -> None:
        self.folder = Path(folder)
        self.fps = int(fps)
        self.features = list(features)
        self.chunks_size = chunks_size
        self.data_limit, self.video_limit = data_mb * MIB, video_mb * MIB
        self.cameras = {
            f.name: Camera(f, chunks_size=chunks_size) for f in self.features if f.kind == "image"
        }
        self.info = self._info_dict(robot_type, data_mb, video_mb)
        self.schema = repair_schema.data_schema(self.info)
        self.tasks: dict[str, int] = {}
        self.parts = EpisodeParts(self.folder, self.info, numeric_features(self.info))
        self._episodes = 0
        self.on_checkpoint: Any = None  # called with state() after each checkpoint
        self.frames = 0
        self.data = DataFiles(
            self.folder, self.schema, chunks_size, data_mb, DataPolicy(target_mb=target_mb)
        )
        self._rows: deque = deque()  # the episodes whose cameras have not answered yet
        # each camera encoded in a process of its own (writers.camera_encoder), started now:
        # their start-up overlaps the reading of the first episode
        self.encoders = {
            name: CameraProcess(cam, self.folder, self.fps, self.video_limit)
            for name, cam in self.cameras.items()
        }

    # ---------------------------------------------------------------------------------------
    def _info_dict(self, robot_type: str | None, data_mb: float, video_mb: float) -> dict:
        from episodekit.writers.image_video import ENCODER_INFO, LEROBOT_RGB

        feats: dict[str, dict] = {}
        for f in self.features:
            if f.kind == "image":
                h, w, c = f.shape
                info = {
                    "video.height": h,
                    "video.width": w,
                    "video.codec": f.video,
                    "video.pix_fmt": LEROBOT_RGB.pix_fmt,
                    "video.fps": self.fps,
                    "video.channels": c,
                    "has_audio": False,
                    **(ENCODER_INFO if f.video == "av1" else {}),
                    "is_depth_map": False,
                }
                feats[f.name] = {
                    "dtype": "video",
                    "shape": [h, w, c],
                    "names": ["height", "width", "channels"],
                    "info": info,
                }
            else:
                names = list(f.names) if f.names else None
                feats[f.name] = {"dtype": f.dtype, "shape": list(f.shape), "names": names}
        feats.update({k: dict(v) for k, v in DEFAULT_COLUMNS.items()})
        return {
            "codebase_version": "v3.0",
            "robot_type": robot_type,
            "total_episodes": 0,
            "total_frames": 0,
            "total_tasks": 0,
            "chunks_size": self.chunks_size,
            "data_files_size_in_mb": data_mb,
            "video_files_size_in_mb": video_mb,
            "fps": self.fps,
            "splits": {},
            "data_path": DATA_PATH_V3,
            "video_path": VIDEO_PATH_V3 if self.cameras else None,
            "features": feats,
        }

    # ---------------------------------------------------------------------------------------
    def add(self, ep: MappedEpisode) -> None:
        """Write one episode (data rows, its frames encoded, its metadata row)."""
        e, n = self._episodes, ep.length
        task_idx = np.array(
            [self.tasks.setdefault(t, len(self.tasks)) for t in ep.tasks], dtype=np.int64
        )
        frame_index = np.arange(n, dtype=np.int64)
        values: dict[str, np.ndarray] = dict(ep.columns)
        values["timestamp"] = (frame_index / self.fps).astype(np.float32)
        values["frame_index"] = frame_index
        values["episode_index"] = np.full(n, e, dtype=np.int64)
        values["index"] = np.arange(self.frames, self.frames + n, dtype=np.int64)
        values["task_index"] = task_idx
        table = self._table(values)
        stats = {}
        for name in repair_schema.stats_features(self.info):
            if name in values:
                stats[name] = repair_schema.lerobot_episode_stats(values[name].reshape(n, -1))
        data_file = self._data(table)
        for name in self.cameras:
            images, channels = ep.images[name]
            enc = self.encoders[name]
            while enc.waiting and (
                enc.in_flight > AHEAD_BYTES or len(enc.waiting) >= AHEAD_EPISODES
            ):
                self._settle(1)  # the oldest episode in flight: its answers, its row
            enc.send_images(images, channels, ep.source, n)
        self._rows.append((e, ep.tasks, n, data_file, self.frames, stats, ep.meta, table))
        self.frames += n
        self._episodes += 1

    def drain(self) -> None:
        """Wait for the cameras' encoding of every episode added (their errors raised here)."""
        self._settle()

    def _settle(self, count: int | None = None) -> None:
        """The oldest ``count`` episodes in flight (None: all): their cameras' answers
        (``videos/*`` values, image stats) taken, their metadata rows written to the parts."""
        for _ in range(len(self._rows) if count is None else count):
            self._settle_one()

    def _settle_one(self) -> None:
        e, tasks, n, data_file, first, stats, meta, table = self._rows.popleft()
        videos = {}
        for name, enc in self.encoders.items():
            videos[name], stats[name] = enc.answer()
        seen: dict[str, None] = {}
        for t in tasks:
            seen.setdefault(t, None)
        row = repair_schema.episode_row(
            self.info,
            e,
            list(seen),
            n,
            chunk_file(data_file, self.chunks_size),
            first,
            videos,
            stats,
            (0, 0),
        )
        self.parts.add(row, meta, table)

    def _table(self, values: dict[str, np.ndarray]) -> pa.Table:
        cols = []
        for fld in self.schema:
            v = values[fld.name]
            if pa.types.is_fixed_size_list(fld.type):
                flat = pa.array(np.ascontiguousarray(v).reshape(-1), type=fld.type.value_type)
                cols.append(pa.FixedSizeListArray.from_arrays(flat, fld.type.list_size))
            else:
                cols.append(pa.array(v.reshape(-1), type=fld.type))
        return pa.Table.from_arrays(cols, schema=self.schema)

    def _data(self, table: pa.Table) -> int:
        """Rows to the current data file (or a new one by LeRobot's rule: a checkpoint first);
        its file number."""
        if self.data.is_open and self.data.rolls_over(float(table.nbytes)):
            self._checkpoint()
        return self.data.add(table)

    def _checkpoint(self) -> None:
        """The data file is full: close it and read it back, close the cameras' mp4s (and
        check their frames), write the episodes' parts; then tell ``on_checkpoint``."""

        self._settle()
        rel = self.data.close() or self.data.rel()
        pa.default_memory_pool().release_unused()  # the last row group's write buffers
        self.data.verify(rel)
        for enc in self.encoders.values():
            enc.close_file()  # its frames read back by the encoding process
        self.parts.flush()
        pa.default_memory_pool().release_unused()  # the closed file's buffers back to the OS
        if self.on_checkpoint is not None:
            self.on_checkpoint(self.state())

    def state(self) -> dict:
        """What a checkpoint keeps (JSON): the episodes, frames, tasks, parts, every closed
        data file (first row, rows, column digests) and video file (frames)."""
        return {
            "episodes": self._episodes,
            "frames": self.frames,
            "tasks": list(self.tasks),
            "parts": self.parts.parts,
            "file_no": self.data.file_no,
            "data": self.data.state(),
            "cameras": {k: [c.file_no, dict(c.counts)] for k, c in self.cameras.items()},
        }

    def restore(self, state: dict) -> None:
        """Carry on from a checkpoint's :meth:`state` (a fresh sink over the same folder):
        what it lists is kept, everything else the killed run wrote is removed."""
        self._episodes, self.frames = int(state["episodes"]), int(state["frames"])
        self.tasks = {t: i for i, t in enumerate(state["tasks"])}
        self.data.restore(state["file_no"], self.frames, state["data"])
        keep = set(state["data"])
        for name, (file_no, counts) in state["cameras"].items():
            cam = self.cameras[name]
            cam.counts = {k: int(v) for k, v in counts.items()}
            self.encoders[name].restore(int(file_no))
            keep.update(cam.counts)
        for top in ("data", "videos", "meta"):
            for p in sorted((self.folder / top).rglob("*")) if (self.folder / top).is_dir() else []:
                if p.is_file() and p.relative_to(self.folder).as_posix() not in keep:
                    p.unlink()
        self.parts.keep(int(state["parts"]))

    def abort(self) -> None:
        """Close what is open after an error (the folder is discarded by the caller)."""
        self._rows.clear()
        for enc in self.encoders.values():
            enc.stop()
        self.data.abort()

    # ---------------------------------------------------------------------------------------
    def finish(self) -> SinkResult:
        """Close the files, write the metadata, verify the folder (see the module docstring)."""
        from episodekit.core.dataset import open_dataset
        from episodekit.metadata.stats import data_state

        if not self._episodes:
            raise DatasetError("no episodes to write (every episode was skipped or none found)")
        self._settle()
        self.data.close()
        for enc in self.encoders.values():
            enc.finish()
        n = self._episodes
        self.parts.flush()
        lengths = self.parts.write_meta(self.folder, n, self.data_limit, self.chunks_size)
        tasks = list(self.tasks)
        sink_meta.write_tasks(self.folder, tasks)
        plan = SimpleNamespace(num_episodes=n, num_frames=self.frames, length=lengths.to_numpy())
        info = meta_mod.info_json(self.info, plan, len(tasks), self.info["features"])
        sink_meta.write_info(self.folder, info)
        stats: dict[str, dict[str, list]] = {}
        for name, feat in self.info["features"].items():  # one feature's columns at a time
            stats.update(meta_mod.dataset_stats(self.parts.stats_table(name), {name: feat}, {}))
        stats = {k: stats[k] for k in self.info["features"] if k in stats}
        rels = list(self.data.checksums)
        sink_meta.finish_stats(self.folder, stats, sink_meta.IMPORT, rels, self.parts.feats)
        ds = open_dataset(str(self.folder))
        meta = {"fingerprint": ds.fingerprint, "data_state": data_state(ds), "stats": "quantiles"}
        self.parts.write_sketches(self.folder, meta)
        self.verify(plan)
        return SinkResult(
            episodes=n,
            frames=self.frames,
            tasks=len(tasks),
            data_files=len(self.data.checksums),
            video_files=sum(len(c.counts) for c in self.cameras.values()),
            features=[f.name for f in self.features],
        )

    def verify(self, plan: Any) -> None:
        """Every data file read back (rows, ``index``, per-column checksums), every mp4's
        frame count, the root read as a dataset: :class:`VerificationError` on a difference."""
        from episodekit.writers.verify import verify_root, verify_videos

        for rel in self.data.checksums:
            self.data.verify(rel)
        # the mp4s this run closed were read back by their encoding process as they closed
        unchecked = {
            k: {rel: n for rel, n in c.counts.items() if rel not in self.encoders[k].checked}
            for k, c in self.cameras.items()
        }
        verify_videos(self.folder, unchecked)
        verify_root(self.folder, plan)


def features_from_map(m: Any, keys: dict, video: str) -> list[SinkFeature]:
    """The sink's features from an import map (``importers.mapping.ImportMap``) and the
    source's keys; ``video`` is ``--video`` (a feature's own ``video`` wins). Image features
    with video ``none`` are refused: images kept in the data files are not written yet."""
    from episodekit.importers.mapping import MapError, feature_dtype, feature_shape

    out = []
    for f in m.features:
        shape = feature_shape(f, keys)
        if f.kind == "image":
            codec = f.video or video
            if codec == "none":
                raise MapError(
                    f"features.{f.name!r}: images are only written as video here; give "
                    "--video av1 or h264, or leave the feature out of the map (--map)"
                )
            if len(shape) != 3 or shape[2] != 3:
                raise MapError(f"features.{f.name!r}: images of shape {shape}, need (H, W, 3)")
            out.append(SinkFeature(f.name, "image", "video", tuple(shape), None, codec))
        else:
            out.append(
                SinkFeature(f.name, "array", feature_dtype(f, keys), tuple(shape), f.names, video)
            )
    return out
