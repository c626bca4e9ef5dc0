"""What a synthetic sample is: :class:`SampleSpec` and the choices it accepts (light: the CLI
offers them without importing numpy or pyarrow)."""

from __future__ import annotations

from dataclasses import dataclass

STYLES = ("recorded", "edited")  # row-group styles found in the wild
VERSIONS = ("v3.0", "v2.1")
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
    """Parameters of a synthetic dataset (see :func:`~episodekit.sample.writer.write_sample`)."""

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
