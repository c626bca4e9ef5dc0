"""Write a v3.0 dataset from an ordered list of source episodes: staged, verified, published
atomically, resumable.

The one writer behind ``edit``, ``split`` and ``merge`` (and ``convert``): its input is a list
of :class:`~episodekit.writers.sources.SourceEpisode` taken from
:class:`~episodekit.core.dataset.Dataset` objects (v3.0 or v2.1), in output order. Everything
is written into ``<out>.partial-<key>`` next to ``--out`` (``key`` hashes the inputs and
options), verified (:mod:`~episodekit.writers.verify`), then swapped into place with
renames, under ``--out``'s writer lock. A run killed at any point leaves ``--out`` as it was (or
absent, between the two renames); the next run removes the stale staging folder and starts
over. A rerun with the same inputs finds the key recorded in ``--out`` and does nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from episodekit.core.atomic import atomic_write_text, fsync_dir
from episodekit.core.dataset import Dataset
from episodekit.core.errors import DatasetError, EnvironmentProblem, os_problem
from episodekit.core.lock import LOCK_NAME, writer_lock
from episodekit.core.memory import release_memory
from episodekit.core.outdir import check_output_dir, mark_output_dir
from episodekit.core.paths import DEFAULT_TARGET_MB, MIB
from episodekit.core.progress import current
from episodekit.writers import meta as meta_mod
from episodekit.writers.data import output_schema, write_data
from episodekit.writers.plan import OutputPlan, plan_output
from episodekit.writers.sources import SourceEpisode, episode_meta
from episodekit.writers.verify import (
    VerificationError,
    verify_data,
    verify_root,
    verify_videos,
)

RECIPE_FILE = ".episodekit-surgery.json"  # at the output's root: what it was written from
REQUIRED = ("index", "episode_index", "frame_index", "timestamp", "task_index")
FORMAT_VERSION = 1


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

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _datasets(sources: list[SourceEpisode]) -> list[Dataset]:
    seen: dict[int, Dataset] = {}
    for s in sources:
        seen.setdefault(id(s.ds), s.ds)
    return list(seen.values())


def _source_identity(ds: Dataset) -> dict:
    """What pins a source's content cheaply: fingerprint, info.json, data file sizes/mtimes."""
    files = []
    for rel in ds.data_files:
        try:
            st = ds.fs.info(ds.join(rel))
            files.append([rel, st.get("size"), st.get("mtime") if ds.is_local else None])
        except OSError:
            files.append([rel, None, None])
    root = os.path.realpath(ds.path) if ds.is_local else ds.root
    return {"root": root, "fingerprint": ds.fingerprint, "info": ds.info, "files": files}


def recipe_key(sources: list[SourceEpisode], options: WriteOptions) -> str:
    """Hash of everything the output depends on (sources, selection, options, format)."""
    datasets = _datasets(sources)
    ids = {id(ds): i for i, ds in enumerate(datasets)}
    sel = np.array([[ids[id(s.ds)], s.row] for s in sources], dtype=np.int64)
    h = hashlib.sha256(b"episodekit-surgery\0")
    body = {
        "format": FORMAT_VERSION,
        "sources": [_source_identity(ds) for ds in datasets],
        "options": {
            **{k: v for k, v in options.__dict__.items() if k != "executor"},
            "what": options.what.split()[-1],
        },
    }
    h.update(json.dumps(body, sort_keys=True, default=str).encode())
    h.update(sel.tobytes())
    return h.hexdigest()[:32]


def _check_out(out: Path, datasets: list[Dataset]) -> None:
    real = out.resolve()
    for ds in datasets:
        if not ds.is_local:
            continue
        src = Path(ds.path).resolve()
        if real == src or src in real.parents or real in src.parents:
            raise EnvironmentProblem(
                f"--out must be a new folder outside the source {ds.root} (never in place)",
                str(out),
            )


def _up_to_date(out: Path, key: str) -> bool:
    try:
        recorded = json.loads((out / RECIPE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return recorded.get("key") == key and (out / "meta/info.json").exists()


def _clean_stale(out: Path) -> None:
    """Remove staging and swapped-out folders of earlier runs killed before the end (the lock
    is held: no live writer uses them)."""
    for p in out.parent.glob(f"{out.name}.partial-*"):
        shutil.rmtree(p, ignore_errors=True)
    for p in out.parent.glob(f"{out.name}.old-*"):
        shutil.rmtree(p, ignore_errors=True)


def _publish(staging: Path, out: Path) -> None:
    """Swap the verified staging folder into ``out`` (two renames; ``out`` is never partial)."""
    old = out.with_name(f"{out.name}.old-{uuid.uuid4().hex[:8]}")
    try:
        if out.exists():
            os.rename(out, old)
        os.rename(staging, out)
    except OSError as exc:
        raise os_problem(exc, out, "publish") from exc
    fsync_dir(out.parent)
    shutil.rmtree(old, ignore_errors=True)


def write_dataset(
    sources: list[SourceEpisode], out: str | os.PathLike, options: WriteOptions | None = None
) -> WriteResult:
    """Write ``sources`` (in this order) as a new v3.0 dataset at ``out`` (see the module
    docstring). ``out`` must be missing, empty or episodekit's; never a source or inside one."""
    options = options or WriteOptions()
    t0 = time.perf_counter()
    out_path = check_output_dir(out)
    datasets = _datasets(sources)
    if not sources:
        raise ValueError("no episodes left to write (the selection is empty)")
    _check_out(out_path, datasets)
    features = _features(datasets, set(options.remove_features))
    key = recipe_key(sources, options)
    frames = int(sum(s.length for s in sources))
    result = WriteResult(str(out), "unchanged", len(sources), frames, 0)
    result.sources = [ds.root for ds in datasets]
    created = not out_path.exists()
    try:
        with writer_lock(out_path):
            if _up_to_date(out_path, key):
                info = json.loads((out_path / "meta/info.json").read_text())
                result.tasks = int(info.get("total_tasks") or 0)
                result.seconds = time.perf_counter() - t0
                return result
            _stage_and_publish(out_path, sources, options, features, key, result)
    except BaseException:
        if created:
            _remove_if_only_lock(out_path)
        raise
    result.status = "written"
    result.seconds = time.perf_counter() - t0
    return result


def _remove_if_only_lock(out: Path) -> None:
    """A failed first write leaves no folder behind (only its own lock file was in it)."""
    try:
        if out.is_dir() and set(os.listdir(out)) <= {LOCK_NAME}:
            shutil.rmtree(out)
    except OSError:
        pass


def _stage_and_publish(
    out: Path,
    sources: list[SourceEpisode],
    options: WriteOptions,
    features: dict,
    key: str,
    result: WriteResult,
) -> None:
    _clean_stale(out)
    staging = out.with_name(f"{out.name}.partial-{key[:12]}")
    try:
        staging.mkdir(parents=True)
    except OSError as exc:
        raise os_problem(exc, staging, "create folder") from exc
    try:
        _build(staging, sources, options, features, key, result)
        _publish(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


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
    chunks = int(info0.get("chunks_size") or 1000)
    data_mb = float(info0.get("data_files_size_in_mb") or 100)
    target = int(options.target_mb * MIB)
    say = current().step
    plan = plan_output(sources, target, data_mb)
    release_memory()  # thousands of footers read (v2.x): their freed memory back to the OS
    tasks, maps, ep_tasks = meta_mod.unify_tasks(plan, dict(options.rename_tasks))
    schema = output_schema(plan, removed)
    say(f"writing {plan.num_episodes:,} episodes, {plan.num_frames:,} frames")
    data = write_data(plan, staging, schema, maps, target, chunks, options.executor)
    video_cols, video_frames = _videos(plan, staging, features, info0, chunks)
    metas = [episode_meta(ds) for ds in datasets]
    episodes = meta_mod.episodes_table(
        plan, metas, ep_tasks, chunks, removed, data.tasks, video_cols, data_mb
    )
    meta_mod.write_episodes(staging, episodes)
    del metas
    release_memory()
    pq.write_table(meta_mod.tasks_table(tasks), staging / "meta/tasks.parquet")
    info = meta_mod.info_json(info0, plan, len(tasks), features)
    meta_mod.write_json(staging / "meta/info.json", info)
    fallback = _source_stats(datasets[0]) if len(datasets) == 1 else {}
    meta_mod.write_json(
        staging / "meta/stats.json", meta_mod.dataset_stats(episodes, features, fallback)
    )
    if options.fill_stats:
        from episodekit.writers.stats_fill import fill_missing_stats

        result.stats = fill_missing_stats(staging, complete=options.fill_stats == "complete")
    say("verifying the output against the source rows")
    try:
        verify_data(staging, plan, data, options.executor)
        verify_videos(staging, video_frames)
        verify_root(staging, plan)
    except VerificationError as exc:  # the sources are at fault (or a bug): nothing published
        raise DatasetError(f"the output failed verification, nothing was published: {exc}") from exc
    mark_output_dir(staging, options.what)
    recipe = {"key": key, "what": options.what, "sources": result.sources}
    atomic_write_text(staging / RECIPE_FILE, json.dumps(recipe, indent=2))
    result.tasks = len(tasks)
    result.data_files = len(data.files)
    result.video_files = sum(len(v) for v in video_frames.values())


def _source_stats(ds: Dataset) -> dict:
    from episodekit.core.dataset import read_json

    try:
        stats = read_json(ds.fs, ds.join("meta/stats.json"))
    except (DatasetError, EnvironmentProblem):  # missing or broken: nothing to fall back on
        return {}
    return stats if isinstance(stats, dict) else {}


def _videos(
    plan: OutputPlan, staging: Path, features: dict, info: dict, chunks: int
) -> tuple[dict, dict[str, dict[str, int]]]:
    keys = [k for k, f in features.items() if f.get("dtype") == "video"]
    if not keys:
        return {}, {}
    from episodekit.writers.video import write_videos

    current().step(f"copying the video packets of {len(keys)} cameras")
    limit = float(info.get("video_files_size_in_mb") or 200)
    cols, frames, _reencoded = write_videos(plan, staging, keys, limit, chunks)
    return cols, frames
