"""The registry of ``episodekit validate``'s checks: the one source of every output format.

Each :class:`Check` has an id (``group.name``, what findings carry), a title, its default
severity, a description of what it guards against, whether it runs only with ``--deep``, what
it reads beyond the metadata (``--metadata-only`` runs only the checks that need nothing more),
and a help link into docs/validate-checks.md (generated from this list by
``scripts/gen_check_docs.py``).
The text, JSON, Markdown, GitHub, SARIF, JUnit and HTML outputs, ``--list-checks`` and the
docs page all read from here; which code produces a check is declared by the passes
(:mod:`episodekit.validate.passes`), and a test keeps the two lists equal.

A finding's own severity may differ from its check's default (``video.readable`` is a warning
when PyAV is missing, ``info.names`` one for repeated names): the default is what SARIF calls
the rule's level and what the docs list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from episodekit.validate.raw import Finding

ERROR = "error"
WARNING = "warning"
HELP_PAGE = "docs/validate-checks.md"  # relative to the repository; anchors are the check ids

# What a check reads beyond meta/, the parquet footers and the mp4 boxes (METADATA): what
# `validate --metadata-only` and `--sample-episodes N` run or leave out (validate/scope.py).
METADATA = "metadata"  # meta/, the footers, the mp4 boxes: run in every scope
EPISODE_PAGES = "episode pages"  # each episode's data pages: a sample's row groups decide it
DATA_PAGES = "data pages"  # the data files' pages, not by episode
DATASET_PAGES = "dataset pages"  # every data page: dataset-wide signal statistics
STATS_PAGES = "stats pages"  # every data page, the stats recomputed
FRAMES = "video frames"  # every video frame decoded


@dataclass(frozen=True)
class Check:
    """One check: ``id`` (``group.name``), ``title`` (a few words), default ``severity``,
    ``description`` (what it guards against), ``deep`` (runs only with ``--deep``), ``reads``
    (what it needs read beyond the metadata: :data:`METADATA` and the kinds after it)."""

    id: str
    title: str
    description: str
    severity: str = ERROR
    deep: bool = False
    reads: str = METADATA

    @property
    def group(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def help(self) -> str:
        """Where the check is documented: ``docs/validate-checks.md#<id>``."""
        return f"{HELP_PAGE}#{self.id}"


def _w(id: str, title: str, description: str, deep: bool = False, reads: str = METADATA) -> Check:
    return Check(id, title, description, WARNING, deep, reads)


REGISTRY: tuple[Check, ...] = (
    # info.json against the tables, the files and itself
    Check("info.version", "codebase version readable", "codebase_version is one episodekit reads"),
    Check(
        "info.fps",
        "frame rate consistent",
        "fps is positive, matches video fps and the data's timestamps",
    ),
    Check(
        "info.totals",
        "totals match the tables",
        "total_episodes / total_frames / total_tasks match the tables",
    ),
    Check(
        "info.features",
        "declared features in the data",
        "declared features exist in every data file with matching dtype/shape",
    ),
    Check(
        "info.paths",
        "path templates safe, data files present",
        "path templates are plain and stay inside the root; referenced data files exist",
    ),
    Check("info.videos", "video files present", "every video file the episodes reference exists"),
    Check("info.unreferenced", "no stray data file", "no data file is left unreferenced"),
    Check(
        "info.names",
        "feature names well formed",
        "names is null, a list or {group: list}: one name per dimension (per axis for "
        "images/videos), distinct",
    ),
    Check(
        "info.video",
        "video shape agrees with its fields",
        "a video feature's shape (read through its names) agrees with video.height, video.width "
        "and video.channels",
    ),
    # the tables under meta/
    Check(
        "tasks.table",
        "tasks table valid",
        "tasks table readable, task_index 0..T-1, distinct task strings",
    ),
    Check(
        "episodes.read",
        "episodes table readable",
        "episodes files readable with the required columns",
    ),
    Check("episodes.index", "episode indices 0..N-1", "episode_index is 0..N-1 in order"),
    Check(
        "episodes.ranges",
        "episode ranges contiguous",
        "dataset_from_index / dataset_to_index contiguous from 0",
    ),
    Check(
        "episodes.length",
        "episode lengths match their ranges",
        "length == dataset_to_index - dataset_from_index > 0",
    ),
    Check(
        "episodes.tasks",
        "episode tasks known",
        "every episode's task strings are in the tasks table",
    ),
    # every data row (one duckdb scan)
    Check("data.read", "data files readable", "data files are readable parquet"),
    Check(
        "data.file",
        "rows in their episode's file",
        "every data row belongs to an episode placed in that file",
        reads=EPISODE_PAGES,
    ),
    Check("data.rows", "rows per episode", "rows per episode == length", reads=EPISODE_PAGES),
    Check(
        "data.frame_index",
        "frame_index 0..length-1",
        "frame_index is 0..length-1",
        reads=EPISODE_PAGES,
    ),
    Check(
        "data.index",
        "index contiguous",
        "index is contiguous and equals the episode's range",
        reads=EPISODE_PAGES,
    ),
    Check(
        "data.timestamp",
        "timestamps on the frame clock",
        "timestamp == frame_index / fps within tolerance",
        reads=EPISODE_PAGES,
    ),
    Check(
        "data.task_index",
        "task_index valid",
        "task_index valid and equal to the episode's task",
        reads=EPISODE_PAGES,
    ),
    Check(
        "data.nulls",
        "no nulls",
        "no nulls in feature columns (nor inside their lists)",
        reads=EPISODE_PAGES,
    ),
    Check("data.nan", "no NaN or inf", "no NaN/inf in float feature columns", reads=EPISODE_PAGES),
    Check(
        "data.order",
        "rows in index order",
        "rows in each file are in index order (index = the row's place in its range)",
        reads=EPISODE_PAGES,
    ),
    Check(
        "data.shape",
        "list lengths as declared",
        "list lengths match the declared shape",
        reads=EPISODE_PAGES,
    ),
    Check(
        "data.image",
        "image bytes are images",
        "image bytes start with a known image header",
        deep=True,
        reads=EPISODE_PAGES,
    ),
    Check(
        "data.image_shape",
        "images of the declared size",
        "the first image of every data file has the declared height, width and channels",
        deep=True,
        reads=DATA_PAGES,
    ),
    Check(
        "data.language",
        "language columns well formed",
        "language columns (LeRobot main): struct fields and types, known styles in their column, "
        "camera exactly for vqa/trace naming an observation.images.* feature, persistent "
        "timestamps inside their episode",
        reads=DATA_PAGES,
    ),
    # row-group layout (what `prepare` fixes)
    _w("layout.row_groups", "row groups in the target band", "row groups inside the target band"),
    _w(
        "layout.split_episode",
        "episodes not split across row groups",
        "no episode split across row groups",
    ),
    _w("layout.page_index", "page index written", "page index written"),
    # episodekit's artifacts under meta/
    Check(
        "speed.format",
        "speed percentiles readable",
        "speed_percentiles.jsonl parses, has version, one row per task",
    ),
    Check(
        "speed.fresh",
        "speed percentiles fresh",
        "speed_percentiles.jsonl fingerprint matches the episodes",
    ),
    Check(
        "speed.content",
        "speed percentiles right",
        "ascending boundaries, null exactly for sparse tasks, matches recomputation",
    ),
    Check(
        "costs.format",
        "episode costs readable",
        "episode_costs.parquet readable with the documented columns",
    ),
    Check(
        "costs.fresh",
        "episode costs fresh",
        "episode_costs.parquet fingerprint matches the episodes",
    ),
    Check(
        "costs.content",
        "episode costs right",
        "one row per episode, figures match a recomputation",
    ),
    Check("plans.format", "shard plans readable", "shard plans readable"),
    Check("plans.fresh", "shard plans fresh", "shard plan fingerprints match the episodes"),
    Check(
        "plans.content",
        "shard plans right",
        "every episode assigned exactly once, balance figures match",
    ),
    # videos against info.json and the episodes table
    Check(
        "video.readable",
        "videos readable",
        "every referenced mp4 opens and demuxes (a warning when PyAV is missing)",
    ),
    Check(
        "video.codec",
        "video codec as declared",
        "the stream's codec matches info.json video.codec",
    ),
    Check(
        "video.fps",
        "video frame rate as declared",
        "the stream's frame rate matches info.json video.fps and fps",
    ),
    Check(
        "video.size",
        "video size as declared",
        "the stream's width/height match info.json video.width/video.height",
    ),
    Check(
        "video.pix_fmt",
        "pixel format as declared",
        "the stream's pixel format matches info.json video.pix_fmt",
    ),
    Check(
        "video.frames",
        "video frames per episode",
        "frames in [from_timestamp, to_timestamp) == length for every episode, camera",
    ),
    Check(
        "video.timestamps",
        "frames where the data says",
        "from_timestamp + frame_index/fps lands on a frame within tolerance_s",
    ),
    Check(
        "video.decode",
        "every frame decodes",
        "every frame of every video decodes",
        deep=True,
        reads=FRAMES,
    ),
    Check(
        "video.channels",
        "video channels as declared",
        "the stream's pixel format has the declared channels (video.channels, else the shape's)",
    ),
    _w(
        "video.audio",
        "audio stream as declared",
        "the file has an audio stream exactly when info.json has_audio says so",
    ),
    _w(
        "video.gop",
        "keyframe interval as declared",
        "keyframes at most info.json video.g frames apart",
    ),
    # data quality (warnings; thresholds: validate/quality/thresholds.py)
    _w(
        "quality.frozen",
        "frozen action or state",
        "identical action/state vector over >= frozen_share of an episode",
        reads=DATASET_PAGES,
    ),
    _w(
        "quality.frozen_run",
        "frozen mid-episode",
        "identical vector held mid-episode >= frozen_run_seconds",
        reads=DATASET_PAGES,
    ),
    _w(
        "quality.jump",
        "jump",
        "a step beyond jump_sigmas robust step deviations and jump_range_share of the range",
        reads=DATASET_PAGES,
    ),
    _w(
        "quality.out_of_range",
        "value out of range",
        "a value beyond range_sigmas robust deviations of the dataset",
        reads=DATASET_PAGES,
    ),
    _w(
        "quality.clipping",
        "clipping",
        "a dimension stuck at its episode min/max (saturation)",
        reads=DATASET_PAGES,
    ),
    _w(
        "quality.dead_dimension",
        "dead dimension",
        "a dimension constant over the whole dataset",
        reads=DATASET_PAGES,
    ),
    _w(
        "quality.action_range",
        "action outside the state's range",
        "action far outside the state's range of the same joint",
        reads=DATASET_PAGES,
    ),
    _w(
        "quality.dropped_frames",
        "dropped frames",
        "timestamp steps > drop_factor / fps: frames missing",
        reads=DATASET_PAGES,
    ),
    _w(
        "quality.frame_interval",
        "frame interval off",
        "mean timestamp step differs from 1 / fps",
        reads=DATASET_PAGES,
    ),
    _w("quality.empty_episode", "empty episode", "an episode with no frames", reads=DATASET_PAGES),
    _w("quality.single_frame", "single-frame episode", "an episode of one frame"),
    _w("quality.short_episode", "short episode", "an episode shorter than --min-length"),
    _w(
        "quality.length_outlier",
        "episode length outlier",
        "episode length far from its task's typical length",
    ),
    _w(
        "quality.duplicate",
        "duplicate episode",
        "an episode (near-)identical to an earlier one",
        reads=DATASET_PAGES,
    ),
    _w("quality.task_placeholder", "placeholder task", "empty or placeholder task string"),
    _w("quality.task_rare", "rare task", "a task with too few episodes"),
    _w(
        "quality.shift",
        "distribution shift",
        "distribution shift between the first and last quarter of episodes",
        reads=DATASET_PAGES,
    ),
    _w(
        "quality.drift",
        "step change across episodes",
        "a dimension's episode level or spread steps to another value from one episode on "
        "(channels swapped, a sensor recalibrated)",
        reads=DATASET_PAGES,
    ),
    # normalization stats
    Check(
        "stats.present",
        "stats present",
        "meta/stats.json and per-episode stats/<feature>/<key> columns present",
    ),
    Check("stats.finite", "stats finite", "every stats value finite"),
    Check("stats.shape", "stats shapes", "stats shapes match the features (count: [1])"),
    Check(
        "stats.order",
        "stats ordered",
        "min <= q01 <= q10 <= q50 <= q90 <= q99 <= max, min <= mean <= max",
    ),
    Check("stats.count", "stats counts", "count equals the frames (dataset and per episode)"),
    Check(
        "stats.consistent",
        "dataset stats match the episodes'",
        "dataset min/max/mean/std/count match the merged per-episode stats "
        "(|a-b| <= 1e-6*|b| + 1e-9*(1+scale))",
    ),
    Check(
        "stats.fresh",
        "stats fresh",
        "stats summary fingerprint and data-file state match the root",
    ),
    Check(
        "stats.recompute",
        "stats match the data",
        "every stat matches a recomputation from the data (|a-b| <= 1e-6*|b| + 1e-9*(1+scale))",
        deep=True,
        reads=STATS_PAGES,
    ),
    _w(
        "stats.quantile_rank",
        "quantiles where the data's are",
        "stats.json's quantiles are within 0.01 in rank of the data's",
        deep=True,
        reads=STATS_PAGES,
    ),
)

BY_ID: dict[str, Check] = {c.id: c for c in REGISTRY}
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(c.group for c in REGISTRY))
ALIASES: dict[str, tuple[str, ...]] = {"all": GROUPS, "artifacts": ("speed", "costs", "plans")}
DEEP_ONLY: tuple[str, ...] = tuple(c.id for c in REGISTRY if c.deep)
SEVERITY_RANK = {ERROR: 0, WARNING: 1}  # most severe first


def get(check_id: str) -> Check:
    """The check ``check_id``; an id the registry lacks (a finding of a newer version read
    back) gets a stand-in with its own id as the title."""
    return BY_ID.get(check_id) or Check(check_id, check_id, "")


def ids(*groups: str) -> tuple[str, ...]:
    """The check ids of ``groups`` (all when none), in registry order."""
    return tuple(c.id for c in REGISTRY if not groups or c.group in groups)


def expand(name: str) -> set[str]:
    """The ids a selection name stands for: an alias (``all``, ``artifacts``), a group or an id.
    Raises ValueError on an unknown name."""
    groups = ALIASES.get(name, (name,))
    found = {c.id for c in REGISTRY if c.id in groups or c.group in groups}
    if not found:
        raise ValueError(
            f"unknown check {name!r}; use a group ({', '.join(GROUPS)}), "
            f"'all', 'artifacts' or an id like data.rows"
        )
    return found


def group_by_check(findings: Iterable[Finding]) -> dict[str, list[Finding]]:
    """Findings per check id, in registry order (ids it lacks last)."""
    by_check: dict[str, list[Finding]] = {}
    for f in findings:
        by_check.setdefault(f.check, []).append(f)
    order = {c.id: i for i, c in enumerate(REGISTRY)}
    return dict(sorted(by_check.items(), key=lambda kv: order.get(kv[0], len(order))))
