"""Write a synthetic dataset in the exact LeRobot v3.0 (or v2.1) layout (see the package
docstring), staged aside and swapped in. A v3.0 sample's data files are written by the episode
sink's data files (:class:`~episodekit.writers.sink_data.DataFiles`, the import's too), one
episode at a time, in the layout of its style (:data:`~episodekit.writers.sink_data.RECORDER`:
a row group per episode; :data:`~episodekit.writers.sink_data.EDITOR`: one per file)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa

from episodekit.core import staging
from episodekit.core.layout.files import chunk_file, roll_over
from episodekit.core.layout.info import Info
from episodekit.core.outdir import check_output_dir, mark_output_dir
from episodekit.core.parquet_write import write_table
from episodekit.core.paths import (
    DATA_PATH_V2,
    INFO_FILE,
    MIB,
    VIDEO_PATH_V2,
)
from episodekit.core.video import ENCODERS, require_av
from episodekit.sample.spec import STYLES, VERSIONS, SampleSpec
from episodekit.sample.tables import (
    bytes_per_frame,
    episode_lengths_and_tasks,
    episode_stats_columns,
    features_for,
    frames_table,
    huggingface_metadata,
    task_names,
    tiny_png,
    v21_dataset_stats,
    v21_episode_stats,
)
from episodekit.sample.video import encode_file, write_camera_v30
from episodekit.writers import meta as meta_mod
from episodekit.writers import sink_meta
from episodekit.writers.sink_data import EDITOR, RECORDER, DataFiles


def write_sample(
    root: str | os.PathLike, spec: SampleSpec | None = None, force: bool = False, **kwargs
) -> Path:
    """Write a synthetic LeRobot dataset to ``root`` and return its path.

    ``root`` must be missing, empty or a sample written earlier (its marker file; it is replaced)
    unless ``force``; never the current folder, a parent of it, ``/`` or ``$HOME``
    (:func:`~episodekit.core.outdir.check_output_dir`, raises before anything is deleted).
    ``kwargs`` override fields of ``spec`` (e.g. ``write_sample(p, episodes=10, style="edited")``).
    """
    spec = spec or SampleSpec()
    if kwargs:
        spec = SampleSpec(**{**spec.__dict__, **kwargs})
    if spec.style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {spec.style!r}")
    if spec.version not in VERSIONS:
        raise ValueError(f"version must be one of {VERSIONS}, got {spec.version!r}")
    if spec.episodes < 1:
        raise ValueError("episodes must be >= 1")
    if spec.videos:
        require_av()  # before anything is written: says what to install
        if spec.video_codec not in ENCODERS:
            raise ValueError(f"video_codec must be one of {tuple(ENCODERS)}")
    root = check_output_dir(root, force=force, option="--force")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging.remove_stale(root)
    work = staging.new_staging(root)  # written aside, then swapped in: never a half sample
    try:
        mark_output_dir(work, "episodekit sample")
        (work / "meta").mkdir()
        if spec.version == "v2.1":
            _write_v21(work, spec)
        else:
            _write_v30(work, spec)
        staging.publish(work, root)
    except BaseException:
        staging.discard(work, root)
        raise
    return root


def _setup(spec: SampleSpec) -> tuple:
    """What both layouts' writers start from: episode lengths and tasks, the rows' random
    generator, the features, their huggingface metadata, the image bytes, the task names."""
    lengths, task_of = episode_lengths_and_tasks(spec)
    features = features_for(spec)
    return (
        lengths,
        task_of,
        np.random.default_rng(spec.seed + 1),
        features,
        huggingface_metadata(features),
        tiny_png() if spec.images else None,
        task_names(spec.tasks),
    )


def _write_v30(root: Path, spec: SampleSpec) -> None:
    lengths, task_of, rng, features, hf_meta, png, tasks = _setup(spec)
    n_ep = len(lengths)
    ep_ids = np.arange(n_ep, dtype=np.int64)
    to_index = np.cumsum(lengths)
    from_index = to_index - lengths

    # each episode's size for LeRobot's roll-over rule: an estimate from the spec; the rows are
    # made a file at a time (the random draws depend on it), so the files are known first
    sizes = lengths * bytes_per_frame(spec, len(png or b""))
    file_seq = roll_over(sizes, spec.data_files_size_in_mb * MIB)
    data_chunk, data_file = chunk_file(file_seq, spec.chunks_size)

    episode_cols: dict[str, pa.Array] = {}
    stats_parts: list[dict[str, pa.Array]] = []
    sink: DataFiles | None = None
    for f in np.unique(file_seq).tolist():
        sel = np.flatnonzero(file_seq == f)
        table = frames_table(
            spec,
            rng,
            ep_ids[sel],
            lengths[sel],
            task_of[sel],
            int(from_index[sel[0]]),
            png,
            hf_meta,
        )
        if sink is None:
            policy = EDITOR if spec.style == "edited" else RECORDER
            sink = DataFiles(
                root, table.schema, spec.chunks_size, spec.data_files_size_in_mb, policy
            )
        # the sink decides the files by the same rule on the same sizes
        if not (sink.add_episodes(table, lengths[sel], sizes[sel]) == f).all():
            raise AssertionError(f"data file {f}: the sink rolled over apart from the plan")
        sink.close()  # the file is complete: written now, its rows not held past it
        stats_parts.append(episode_stats_columns(table, features, lengths[sel]))
        del table

    for name in stats_parts[0]:
        episode_cols[name] = pa.concat_arrays([p[name] for p in stats_parts])

    video_cols: dict[str, pa.Array] = {}
    for i in range(spec.videos):
        video_cols.update(write_camera_v30(root, spec, i, lengths, from_index))

    task_lists = pa.ListArray.from_arrays(
        pa.array(np.arange(n_ep + 1, dtype=np.int32)),
        pa.array([tasks[t] for t in task_of.tolist()]),
    )
    cols: dict[str, pa.Array] = {
        "episode_index": pa.array(ep_ids),
        "data/chunk_index": pa.array(data_chunk),
        "data/file_index": pa.array(data_file),
        "dataset_from_index": pa.array(from_index),
        "dataset_to_index": pa.array(to_index),
        **video_cols,
        "tasks": task_lists,
        "length": pa.array(lengths),
        **episode_cols,
    }
    # Episode metadata files roll over like data files (by an estimate of their row size).
    meta_row_bytes = 2000 + 300 * (spec.state_dim + spec.action_dim)
    meta_chunk, meta_file = sink_meta.places(
        n_ep, meta_row_bytes, spec.data_files_size_in_mb * MIB, spec.chunks_size
    )
    cols["meta/episodes/chunk_index"] = pa.array(meta_chunk)
    cols["meta/episodes/file_index"] = pa.array(meta_file)
    episodes = pa.table(cols)
    # the metadata as every dataset writer writes its own (writers.sink_meta): the episodes
    # files, the tasks table, info.json (parsed strictly: one LeRobot could not read is never
    # written) and stats.json, LeRobot 0.4.4's aggregation of the episodes' stats
    # (count-weighted mean and quantiles, parallel-variance std: the SAMPLE policy)
    sink_meta.write_episodes(root, episodes, sink_meta.SAMPLE)
    sink_meta.write_tasks(root, tasks, spec.tasks_index_name)
    base = _info_base(spec, features, lengths)
    base.update(
        data_files_size_in_mb=spec.data_files_size_in_mb,
        video_files_size_in_mb=spec.video_files_size_in_mb,
    )
    plan = SimpleNamespace(num_episodes=n_ep, num_frames=int(lengths.sum()))
    sink_meta.write_info(root, meta_mod.info_json(base, plan, spec.tasks, features))
    stats = meta_mod.dataset_stats(episodes, features, {})
    sink_meta.finish_stats(root, stats, sink_meta.SAMPLE)


def _info_base(spec: SampleSpec, features: dict, lengths: np.ndarray) -> dict:
    """info.json's keys both versions write, in LeRobot's order."""
    n_ep = len(lengths)
    return {
        "codebase_version": spec.version,
        "robot_type": "sample_bot",
        "total_episodes": n_ep,
        "total_frames": int(lengths.sum()),
        "total_tasks": spec.tasks,
        "chunks_size": spec.chunks_size,
        "fps": spec.fps,
        "splits": {"train": f"0:{n_ep}"},
        "features": features,
    }


def _write_v21(root: Path, spec: SampleSpec) -> None:
    lengths, task_of, rng, features, hf_meta, png, tasks = _setup(spec)
    start = 0
    episodes_lines, stats_lines = [], []
    per_episode: list[dict] = []
    for e, (n, t) in enumerate(zip(lengths.tolist(), task_of.tolist())):
        table = frames_table(
            spec, rng, np.array([e]), np.array([n]), np.array([t]), start, png, hf_meta
        )
        path = root / DATA_PATH_V2.format(episode_chunk=e // spec.chunks_size, episode_index=e)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_table(table, path, "snappy", row_group_rows=max(1, n))  # one group, as v2.1 wrote
        for i in range(spec.videos):
            vpath = root / VIDEO_PATH_V2.format(
                episode_chunk=e // spec.chunks_size,
                video_key=f"observation.images.cam{i}",
                episode_index=e,
            )
            vpath.parent.mkdir(parents=True, exist_ok=True)
            encode_file(vpath, spec, i, [(start, n)])
        episodes_lines.append(json.dumps({"episode_index": e, "tasks": [tasks[t]], "length": n}))
        per_episode.append(v21_episode_stats(table, features, n))
        stats_lines.append(json.dumps({"episode_index": e, "stats": per_episode[-1]}))
        start += n
    (root / "meta/episodes.jsonl").write_text("\n".join(episodes_lines) + "\n")
    (root / "meta/episodes_stats.jsonl").write_text("\n".join(stats_lines) + "\n")
    (root / "meta/tasks.jsonl").write_text(
        "\n".join(json.dumps({"task_index": i, "task": s}) for i, s in enumerate(tasks)) + "\n"
    )
    info = _info_base(spec, features, lengths)
    info.update(
        total_chunks=int((len(lengths) - 1) // spec.chunks_size + 1),
        total_videos=len(lengths) * spec.videos,
        data_path=DATA_PATH_V2,
        video_path=VIDEO_PATH_V2 if spec.videos else None,
    )
    # parsed strictly: a sample whose info.json LeRobot could not read is a bug, never written
    sink_meta.write_info(root, Info.parse(info, INFO_FILE))
    sink_meta.write_stats(root, v21_dataset_stats(per_episode), indent=None)
