"""Write v3.0 datasets from ordered lists of source episodes: staged, verified, published
atomically, rerun-safe.

The one writer behind ``edit``, ``split`` and ``merge`` (and ``convert``): its input is a list
of :class:`~episodekit.writers.sources.SourceEpisode` taken from
:class:`~episodekit.core.dataset.Dataset` objects (v3.0 or v2.1), in output order, per output
part (``split`` writes several parts, each a dataset in ``--out/<name>``). Everything is written
into one hidden staging folder next to ``--out`` (:mod:`episodekit.core.staging`: a random token
in its name and a marker inside), verified (:mod:`~episodekit.writers.verify`), then swapped
into place at once, under ``--out``'s writer lock: every part is published together or none
is. A run killed at any point leaves ``--out`` as it was; the next run removes the staging
folders of dead runs (only folders holding our marker) and starts over. A rerun whose inputs
(:mod:`~episodekit.writers.recipe`: every file the output depends on, the selection, the
options, the tool version) match the key recorded in ``--out`` does nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from episodekit.core import staging as staging_mod
from episodekit.core.atomic import atomic_write_text
from episodekit.core.dataset import Dataset
from episodekit.core.errors import DatasetError, EnvironmentProblem, os_problem
from episodekit.core.layout.rules import DEFAULT_SIZES
from episodekit.core.lock import remove_if_only_lock, writer_lock
from episodekit.core.memory import release_memory
from episodekit.core.outdir import check_output_dir, mark_output_dir
from episodekit.core.paths import DEFAULT_TARGET_MB, MAX_TARGET_MB, MIB
from episodekit.core.progress import current
from episodekit.core.words import plural
from episodekit.writers import meta as meta_mod
from episodekit.writers import sink_meta
from episodekit.writers.data import output_schema, write_data
from episodekit.writers.plan import OutputPlan, plan_output
from episodekit.writers.recipe import combined_key
from episodekit.writers.recipe import recipe_key as _key
from episodekit.writers.sources import SourceEpisode, episode_meta
from episodekit.writers.stats_quantiles import stream_want, write_stats_json
from episodekit.writers.stream_stats import patch_episodes
from episodekit.writers.verify import (
    VerificationError,
    verify_data,
    verify_root,
    verify_videos,
)

RECIPE_FILE = ".episodekit-surgery.json"  # at the output's root: what it was written from
REQUIRED = ("index", "episode_index", "frame_index", "timestamp", "task_index")


@dataclass(frozen=True)
class WriteOptions:
    """How to write: features removed, tasks renamed (``old -> new``), the row-group target,
    and what to record (``what``: the command; ``extra``: options that define the output)."""

    what: str = "episodekit edit"
    remove_features: tuple[str, ...] = ()
    rename_tasks: tuple[tuple[str, str], ...] = ()
    target_mb: float = DEFAULT_TARGET_MB
    extra: tuple[tuple[str, str], ...] = ()
    # info.json fields that replace the source's (convert: data/video_files_size_in_mb)
    info_overrides: tuple[tuple[str, float], ...] = ()
    # compute the stats the sources lack (convert: v2.0 has none; "complete": also quantiles)
    fill_stats: str = ""  # "" (never), "missing" or "complete"
    # where the data files are written and verified: "local" (this process) or "ray" (one task
    # per output file); the output is the same either way, so it is not part of the recipe
    executor: str = "local"
    # features added or renamed (writers/features.py FeatureChanges); the caller puts a digest
    # of them in ``extra`` (the recipe)
    changes: Any = None
    # image features (stored in the data files) encoded as video (writers/image_video.py)
    images_to_video: tuple[str, ...] = ()


@dataclass
class WriteResult:
    """What a write did: ``status`` is ``written`` or ``unchanged`` (same inputs as the output)."""

    out: str
    status: str
    episodes: int
    frames: int
    tasks: int
    data_files: int = 0
    video_files: int = 0
    seconds: float = 0.0
    sources: list[str] = field(default_factory=list)
    stats: str = "carried over"  # or what fill_stats computed, and why
    # what a smart cut did (writers/smart_cut.py): frames copied/re-encoded, GOPs, worst PSNR
    video_cut: dict | None = None
    # what --images-to-video encoded (writers/image_video.py): features, files, worst PSNR
    images_to_video: dict | None = None

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        for k in ("video_cut", "images_to_video"):
            if d[k] is None:  # nothing of that kind was done: the summary as before
                del d[k]
        return d


@dataclass
class Part:
    """One dataset of an output: written at ``--out`` (``name`` "") or ``--out/<name>``."""

    name: str
    sources: list[SourceEpisode]
    options: WriteOptions


def _datasets(sources: list[SourceEpisode]) -> list[Dataset]:
    seen: dict[int, Dataset] = {}
    for s in sources:
        seen.setdefault(id(s.ds), s.ds)
    return list(seen.values())


def recipe_key(sources: list[SourceEpisode], options: WriteOptions) -> str:
    """Hash of everything the output depends on (:mod:`~episodekit.writers.recipe`)."""
    datasets = _datasets(sources)
    ids = {id(ds): i for i, ds in enumerate(datasets)}
    sel = np.array([[ids[id(s.ds)], s.row] for s in sources], dtype=np.int64).reshape(-1, 2)
    opts = {k: v for k, v in options.__dict__.items() if k not in ("executor", "changes")}
    opts["what"] = options.what.split()[-1]
    return _key(datasets, sel, json.loads(json.dumps(opts, default=str)))


def _up_to_date(out: Path, key: str, parts: list[Part]) -> bool:
    try:
        recorded = json.loads((out / RECIPE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return recorded.get("key") == key and all(
        (out / p.name / "meta/info.json").exists() for p in parts
    )


def write_dataset(
    sources: list[SourceEpisode], out: str | os.PathLike, options: WriteOptions | None = None
) -> WriteResult:
    """Write ``sources`` (in this order) as a new v3.0 dataset at ``out`` (see the module
    docstring). ``out`` must be missing, empty or episodekit's; never a source or inside one."""
    options = options or WriteOptions()
    return write_parts([Part("", sources, options)], out, options.what)[""]


def write_parts(parts: list[Part], out: str | os.PathLike, what: str) -> dict[str, WriteResult]:
    """Write every part (``--out`` itself for name "", else ``--out/<name>``) and publish them
    together (see the module docstring); ``what`` names the command in the markers."""
    t0 = time.perf_counter()
    datasets = _datasets([s for p in parts for s in p.sources])
    out_path = check_output_dir(out, sources=[ds.path for ds in datasets if ds.is_local])
    for p in parts:
        if not p.sources:
            raise ValueError("no episodes left to write (the selection is empty)")
        if not 0 < p.options.target_mb <= MAX_TARGET_MB:
            raise ValueError(
                f"--target-mb {p.options.target_mb:g}: expected 0 < MiB <= {MAX_TARGET_MB}"
            )
    features = {
        p.name: _features(_datasets(p.sources), set(p.options.remove_features)) for p in parts
    }
    keys = {p.name: recipe_key(p.sources, p.options) for p in parts}
    key = keys[""] if list(keys) == [""] else combined_key(keys)
    results = {}
    for p in parts:
        frames = int(sum(s.length for s in p.sources))
        r = WriteResult(str(Path(out) / p.name) if p.name else str(out), "unchanged",
                        len(p.sources), frames, 0)  # fmt: skip
        r.sources = [ds.root for ds in _datasets(p.sources)]
        results[p.name] = r
    created = not out_path.exists()
    try:
        with writer_lock(out_path):
            staging_mod.remove_stale(out_path)  # a killed run's folders, even when up to date
            if _up_to_date(out_path, key, parts):
                for p in parts:
                    info = json.loads((out_path / p.name / "meta/info.json").read_text())
                    results[p.name].tasks = int(info.get("total_tasks") or 0)
            else:
                _stage_and_publish(out_path, parts, features, keys, key, what, results)
    except BaseException:
        if created:
            remove_if_only_lock(out_path)
        raise
    for r in results.values():
        r.seconds = time.perf_counter() - t0
    return results


def _stage_and_publish(
    out: Path,
    parts: list[Part],
    features: dict[str, dict],
    keys: dict[str, str],
    key: str,
    what: str,
    results: dict[str, WriteResult],
) -> None:
    staging = staging_mod.new_staging(out)
    try:
        for p in parts:
            folder = staging / p.name if p.name else staging
            folder.mkdir(exist_ok=True)
            _build(folder, p.sources, p.options, features[p.name], keys[p.name], results[p.name])
        if parts[0].name:  # a folder of parts: its own marker and key
            mark_output_dir(staging, what)
            atomic_write_text(staging / RECIPE_FILE, json.dumps({"key": key, "what": what}))
        staging_mod.publish(staging, out)
    except OSError as exc:
        staging_mod.discard(staging, out)
        problem = os_problem(exc, out, "write (nothing was published)")
        if isinstance(problem, EnvironmentProblem):  # a full disk, a read-only folder...
            raise problem from exc
        raise  # e.g. a source file that went missing: its own error names it
    except EnvironmentProblem as exc:
        staging_mod.discard(staging, out)
        raise _named_for_out(exc, staging, out) from exc
    except BaseException:
        staging_mod.discard(staging, out)
        raise
    for r in results.values():
        r.status = "written"


def _named_for_out(exc: EnvironmentProblem, staging: Path, out: Path) -> EnvironmentProblem:
    """The error of a file in the hidden staging folder, told as the file under ``out`` it was
    going to be (a user knows that name), saying that nothing was published."""
    path, text = exc.path or "", str(exc)
    if not path.startswith(str(staging)) or not text.startswith(path + ": "):
        return exc
    new = EnvironmentProblem(
        f"{text[len(path) + 2 :]} (nothing was published)", str(out) + path[len(str(staging)) :]
    )
    new.errno = getattr(exc, "errno", None)  # type: ignore[attr-defined]
    return new


def feature_difference(a: dict, b: dict) -> str | None:
    """The first difference between two feature dicts that matters for one dataset (names,
    dtype, shape, names of dimensions), as words; None when they match."""
    for k in sorted(set(a) | set(b)):
        if k not in b:
            return f"feature {k!r} is missing"
        if k not in a:
            return f"it has an extra feature {k!r}"
        for attr in ("dtype", "shape", "names"):
            x, y = a[k].get(attr), b[k].get(attr)
            if (list(x) if isinstance(x, (list, tuple)) else x) != (
                list(y) if isinstance(y, (list, tuple)) else y
            ):
                return f"feature {k!r} has {attr} {y} instead of {x}"
    return None


def _features(datasets: list[Dataset], removed: set[str]) -> dict:
    """The output features: the first source's without ``removed``; every source must match."""
    first = datasets[0]
    for k in sorted(removed):
        if k not in first.features:
            raise ValueError(
                f"--remove-feature {k}: no such feature (have {sorted(first.features)})"
            )
        if k in REQUIRED:
            raise ValueError(f"--remove-feature {k}: LeRobot datasets need that column")
    features = {k: v for k, v in first.features.items() if k not in removed}
    for ds in datasets[1:]:
        other = {k: v for k, v in ds.features.items() if k not in removed}
        diff = feature_difference(features, other)
        if diff:
            raise ValueError(f"{ds.root}: features differ from {first.root}'s: {diff}")
        if ds.fps != first.fps:
            raise ValueError(f"{ds.root}: fps {ds.fps:g} differs from {first.root}'s {first.fps:g}")
    return features


def _build(
    staging: Path,
    sources: list[SourceEpisode],
    options: WriteOptions,
    features: dict,
    key: str,
    result: WriteResult,
) -> None:
    datasets = _datasets(sources)
    removed = set(options.remove_features)
    info0 = {**datasets[0].info, **dict(options.info_overrides)}
    chunks = int(info0.get("chunks_size") or DEFAULT_SIZES["chunks_size"])
    data_mb = float(info0.get("data_files_size_in_mb") or DEFAULT_SIZES["data_files_size_in_mb"])
    target = int(options.target_mb * MIB)
    say = current().step
    changes = options.changes
    if changes:  # features added or renamed (writers/features.py)
        features = changes.features(features)
    plan = plan_output(sources, target, data_mb)
    plan.changes = changes
    want, reused = stream_want(plan, features)  # stats reduced while the rows are written
    plan.stream = want if want else None
    release_memory()  # thousands of footers read (v2.x): their freed memory back to the OS
    tasks, maps, ep_tasks = meta_mod.unify_tasks(plan, dict(options.rename_tasks))
    to_video = tuple(options.images_to_video)
    schema = output_schema(plan, removed | set(to_video))  # images leave the data files
    if changes:
        schema = changes.schema(schema)
    say(f"writing {plural(plan.num_episodes, 'episode')}, {plural(plan.num_frames, 'frame')}")
    data = write_data(plan, staging, schema, maps, target, chunks, options.executor)
    lossless = dict(options.extra).get("video_cut") == "lossless"
    kept_video = {k: v for k, v in features.items() if k not in to_video}
    video_cols, video_frames, result.video_cut = _videos(
        plan, staging, kept_video, info0, chunks, lossless
    )
    encoded = None
    if to_video:
        from episodekit.writers.image_video import encode_images

        encoded = encode_images(plan, staging, to_video, info0, chunks, options.executor)
        video_cols.update(encoded.columns)
        video_frames.update(encoded.frame_counts(plan))
        features = encoded.features(features, float(datasets[0].fps))
    metas = [episode_meta(ds) for ds in datasets]
    episodes = meta_mod.episodes_table(
        plan, metas, ep_tasks, chunks, removed, data.tasks, video_cols, data_mb, features
    )
    if changes:
        episodes = changes.episodes(episodes)
    if data.streamed is not None:  # episodes cut inside, added features: their new stats
        episodes = patch_episodes(episodes, data.streamed)
    sink_meta.write_episodes(staging, episodes, sink_meta.SURGERY)
    del metas
    release_memory()
    sink_meta.write_tasks(staging, tasks)
    sink_meta.write_info(staging, meta_mod.info_json(info0, plan, len(tasks), features))
    if plan.frames:  # image/video stats of the episodes cut inside: their sampled frames
        from episodekit.writers.frame_rows import cut_image_stats

        patched = cut_image_stats(staging, episodes, np.array(sorted(plan.frames)))
        if patched is not None:
            episodes = patched
            sink_meta.write_episodes(staging, episodes, sink_meta.SURGERY)
    fallback = _source_stats(datasets[0]) if len(datasets) == 1 else {}
    if changes:
        fallback = changes.stats(fallback)
    stats = meta_mod.dataset_stats(episodes, features, fallback)
    write_stats_json(staging, plan, stats, options.executor, data.streamed, reused, data.tasks)
    recompute = bool(plan.frames or (changes and changes.added))
    if recompute:
        result.stats = _stream_summary(plan, changes)
    elif options.fill_stats:
        from episodekit.writers.stats_fill import fill_missing_stats

        result.stats = fill_missing_stats(staging, complete=options.fill_stats == "complete")
    say("verifying the output against the source rows")
    try:
        verify_data(staging, plan, data, options.executor)
        verify_videos(staging, video_frames)
        if encoded is not None:
            from episodekit.writers.image_video import verify_encoded

            say("decoding the new videos back: every frame against its image")
            verify_encoded(staging, plan, encoded, options.executor)
            result.images_to_video = encoded.summary(plan)
        verify_root(staging, plan)
        if plan.frames:
            from episodekit.writers.frame_rows import verify_frames

            verify_frames(staging, plan)
    except VerificationError as exc:  # the sources are at fault (or a bug): nothing published
        raise DatasetError(f"the output failed verification, nothing was published: {exc}") from exc
    mark_output_dir(staging, options.what)
    recipe = {"key": key, "what": options.what, "sources": result.sources}
    atomic_write_text(staging / RECIPE_FILE, json.dumps(recipe, indent=2))
    result.tasks = len(tasks)
    result.data_files = len(data.files)
    result.video_files = sum(len(v) for v in video_frames.values())


def _stream_summary(plan: OutputPlan, changes: Any) -> str:
    """What the summary says of the stats of an edit that cut frames or added features."""
    what = []
    if plan.frames:
        what.append(f"{plural(len(plan.frames), 'episode')} cut inside")
    if changes and changes.added:
        what.append(f"{plural(len(changes.added), 'added feature')}")
    return f"computed while writing ({', '.join(what)}); the others' carried over"


def _source_stats(ds: Dataset) -> dict:
    from episodekit.core.dataset import read_json

    try:
        stats = read_json(ds.fs, ds.join("meta/stats.json"))
    except (DatasetError, EnvironmentProblem):  # missing or broken: nothing to fall back on
        return {}
    return stats if isinstance(stats, dict) else {}


def _videos(
    plan: OutputPlan, staging: Path, features: dict, info: dict, chunks: int, lossless: bool
) -> tuple[dict, dict[str, dict[str, int]], dict | None]:
    """The video stage: packet copy, or a smart cut (writers/frame_video.py) when episodes are
    cut inside or an episode does not start on a keyframe (unless ``lossless``)."""
    from episodekit.prep.remux import CutNotOnKeyframe

    keys = [k for k, f in features.items() if f.get("dtype") == "video"]
    if not keys:
        return {}, {}, None
    from episodekit.writers.video import write_videos

    limit = float(info.get("video_files_size_in_mb") or DEFAULT_SIZES["video_files_size_in_mb"])
    if not plan.frames:
        current().step(f"copying the video packets of {plural(len(keys), 'camera')}")
        try:
            cols, frames, _reencoded = write_videos(plan, staging, keys, limit, chunks)
            return cols, frames, None
        except CutNotOnKeyframe:
            if lossless:
                raise
            current().step("an episode starts off a keyframe: re-encoding that group of pictures")
            shutil.rmtree(staging / "videos", ignore_errors=True)  # this run's partial copies
    from episodekit.writers.frame_video import write_videos as cut_videos

    if plan.frames:
        current().step(
            f"cutting the video of {plural(len(keys), 'camera')}: packets copied, except in a "
            "group of pictures a cut splits (re-encoded)"
        )
    cols, frames, cut = cut_videos(plan, staging, keys, limit, chunks, lossless)
    return cols, frames, cut.as_dict()
