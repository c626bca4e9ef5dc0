"""Metadata checks: info.json vs the episodes/tasks tables and the files on disk; episodes table.

Each function takes the :class:`RawRoot` and returns findings; none of them reads data pages.
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.dataset import SUPPORTED_VERSIONS, V2, is_local, list_files
from episodekit.core.paths import UnsafePathError, format_template, inside_root
from episodekit.validate.raw import ERROR, WARNING, Finding, RawRoot, has_footer, repair_hint

INFO = "meta/info.json"
MAX_PER_KIND = 50  # findings of one kind beyond this are summarized in one line


def _per_episode(
    check: str, mask: np.ndarray, raw: RawRoot, message, severity: str = ERROR
) -> list[Finding]:
    """One finding per flagged episode row (capped, with a summary of the rest)."""
    ep = raw.episodes
    rows = np.flatnonzero(mask)
    files = ep.column("__file").to_pylist() if len(rows) else []
    epi = ep.column("episode_index").to_numpy()
    out = [
        Finding(check, severity, message(int(r)), files[r], int(epi[r]))
        for r in rows[:MAX_PER_KIND]
    ]
    if len(rows) > MAX_PER_KIND:
        out.append(
            Finding(
                check,
                severity,
                f"... and {len(rows) - MAX_PER_KIND} more episodes with the same problem",
                files[rows[MAX_PER_KIND]],
                int(epi[rows[MAX_PER_KIND]]),
            )
        )
    return out


def check_version(raw: RawRoot) -> list[Finding]:
    """``info.version``: codebase_version is one episodekit reads."""
    v = raw.info.get("codebase_version")
    if v in SUPPORTED_VERSIONS:
        return []
    return [
        Finding(
            "info.version",
            ERROR,
            f"unknown codebase_version {v!r} (supported: {', '.join(SUPPORTED_VERSIONS)}); "
            "read as v3.0",
            INFO,
        )
    ]


def check_fps(raw: RawRoot) -> list[Finding]:
    """``info.fps``: fps is a positive number and every video feature agrees with it."""
    fps = raw.info.get("fps")
    if raw.fps is None:
        return [Finding("info.fps", ERROR, f"fps must be a positive number, got {fps!r}", INFO)]
    out = []
    for key, f in raw.features.items():
        vfps = (f.get("info") or {}).get("video.fps") if isinstance(f, dict) else None
        if vfps is not None and abs(float(vfps) - raw.fps) > 1e-6:
            out.append(
                Finding("info.fps", ERROR, f"feature {key}: video.fps {vfps} != fps {fps}", INFO)
            )
    return out


def check_totals(raw: RawRoot) -> list[Finding]:
    """``info.totals``: total_episodes / total_frames / total_tasks match the tables."""
    actual = {}
    if raw.episodes is not None:
        actual["total_episodes"] = raw.episodes.num_rows
        actual["total_frames"] = int(pc.sum(raw.episodes["length"]).as_py() or 0)
    if raw.tasks is not None:
        actual["total_tasks"] = raw.tasks.num_rows
    out = []
    for key, value in actual.items():
        stated = raw.info.get(key)
        if stated is None:
            out.append(Finding("info.totals", WARNING, f"{key} is missing", INFO))
        elif not isinstance(stated, int) or stated != value:
            msg = f"{key} is {stated} but the episodes/tasks tables give {value}"
            if key == "total_episodes" and isinstance(stated, int) and stated > value:
                msg += f" ({repair_hint(raw.root)})"  # rows the recorder never flushed
            out.append(Finding("info.totals", ERROR, msg, INFO))
    return out


def check_tasks_table(raw: RawRoot) -> list[Finding]:
    """``tasks.table``: task_index is 0..T-1 without repeats, task strings are distinct."""
    if raw.tasks is None:
        return []
    rel = "meta/tasks.jsonl" if raw.version in V2 else "meta/tasks.parquet"
    idx = raw.tasks["task_index"].to_numpy()
    out = []
    if not np.array_equal(idx, np.arange(len(idx))):
        out.append(
            Finding(
                "tasks.table",
                ERROR,
                f"task_index must be 0..{len(idx) - 1} without gaps or repeats, "
                f"got {idx[:10].tolist()}",
                rel,
            )
        )
    n_unique = pc.count_distinct(raw.tasks["task"]).as_py()
    if n_unique != raw.tasks.num_rows:
        out.append(Finding("tasks.table", ERROR, "task strings are not distinct", rel))
    return out


def check_episode_index(raw: RawRoot) -> list[Finding]:
    """``episodes.index``: episode_index is 0..N-1 in stored order (no gap, repeat, disorder)."""
    if raw.episodes is None or raw.episodes.num_rows == 0:
        return []
    ep = raw.episodes["episode_index"].to_numpy()
    bad = ep != np.arange(len(ep))
    if not bad.any():
        return []
    first = int(np.argmax(bad))
    seen = np.unique(ep, return_counts=True)
    dups = seen[0][seen[1] > 1]
    detail = f"; repeated: {dups[:10].tolist()}" if len(dups) else ""
    return [
        Finding(
            "episodes.index",
            ERROR,
            f"episode_index must be 0..{len(ep) - 1} in order; row {first} holds "
            f"{int(ep[first])}{detail}",
            raw.episodes["__file"][first].as_py(),
            int(ep[first]),
        )
    ]


def check_ranges(raw: RawRoot) -> list[Finding]:
    """``episodes.ranges`` and ``episodes.length``: contiguous index ranges, length == to - from."""
    if raw.episodes is None or raw.episodes.num_rows == 0 or raw.version in V2:
        return []
    e = raw.episodes
    frm = e["dataset_from_index"].to_numpy()
    to = e["dataset_to_index"].to_numpy()
    length = e["length"].to_numpy()
    expected_from = np.concatenate([[0], to[:-1]])
    out = _per_episode(
        "episodes.ranges",
        frm != expected_from,
        raw,
        lambda r: (
            f"dataset_from_index {frm[r]} but the previous episode ends at {expected_from[r]}"
        ),
    )
    out += _per_episode(
        "episodes.length",
        (length != to - frm) | (length <= 0),
        raw,
        lambda r: (
            f"length {length[r]} != dataset_to_index - dataset_from_index ({to[r]} - {frm[r]})"
        ),
    )
    return out


def check_episode_tasks(raw: RawRoot) -> list[Finding]:
    """``episodes.tasks``: every episode has tasks, every task string is in the tasks table."""
    if raw.episodes is None or raw.tasks is None or raw.episodes.num_rows == 0:
        return []
    tasks = raw.episodes["tasks"].combine_chunks()
    n_tasks = pc.list_value_length(tasks).fill_null(0).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(tasks)
    known = pc.is_in(flat, value_set=raw.tasks["task"]).fill_null(False)
    owner = pc.list_parent_indices(tasks).to_numpy()
    unknown = np.zeros(len(n_tasks), dtype=bool)
    unknown[owner[~known.to_numpy(zero_copy_only=False)]] = True
    flat_list = flat.to_pylist() if unknown.any() else []
    offsets = tasks.offsets.to_numpy() - tasks.offsets[0].as_py() if unknown.any() else None

    def msg(r: int) -> str:
        if n_tasks[r] == 0:
            return "episode has no task"
        names = [t for t in flat_list[offsets[r] : offsets[r + 1]]]
        return f"task string(s) not in the tasks table: {names}"

    return _per_episode("episodes.tasks", unknown | (n_tasks == 0), raw, msg)


def unsafe_reason(raw: RawRoot, rel: str) -> str | None:
    """Why ``rel`` (already a checked relative path) is unsafe on this root, else None: on a local
    root it must resolve inside the root with symlinks followed."""
    if not is_local(raw.fs) or rel.startswith("<"):
        return None
    try:
        inside_root(raw.path, rel)
    except UnsafePathError as exc:
        return str(exc)
    return None


def check_paths(raw: RawRoot) -> list[Finding]:
    """``info.paths``: every referenced data (and video) file stays inside the root, and every
    referenced data file exists; ``info.videos``: every video file exists."""
    if raw.episodes is None or raw.episodes.num_rows == 0:
        return []
    e = raw.episodes
    ep = e["episode_index"].to_numpy()
    out = []
    data_file = e["data_file"].to_pylist()
    first_ep: dict[str, int] = {}
    for f, i in zip(data_file, ep):
        first_ep.setdefault(f, int(i))
    for f, i in first_ep.items():
        why = unsafe_reason(raw, f)
        if why:
            out.append(Finding("info.paths", ERROR, why, f, i))
        elif not f.startswith("<") and not raw.fs.exists(raw.join(f)):
            out.append(Finding("info.paths", ERROR, "referenced data file is missing", f, i))
    template = raw.info.get("video_path")
    # read at the first missing video, once: the source of a copy made without its videos
    copy_source = functools.cache(lambda: _copied_without_videos(raw))
    for key, feat in raw.features.items():
        if not isinstance(feat, dict) or feat.get("dtype") != "video":
            continue
        cols = (f"videos/{key}/chunk_index", f"videos/{key}/file_index")
        if raw.version in V2:
            continue  # one mp4 per episode: not checked file by file
        if not template or any(c not in e.column_names for c in cols):
            out.append(
                Finding(
                    "info.videos",
                    ERROR,
                    f"video feature {key} has no video_path or no {cols[0]} column",
                    INFO,
                )
            )
            continue
        c = e[cols[0]].to_numpy()
        fi = e[cols[1]].to_numpy()
        key_ids, first = np.unique(c.astype(np.int64) * (1 << 32) + fi, return_index=True)
        for i in first:
            try:
                rel = format_template(
                    template, video_key=key, chunk_index=int(c[i]), file_index=int(fi[i])
                )
            except UnsafePathError as exc:
                out.append(Finding("info.paths", ERROR, f"video_path cannot be used: {exc}", INFO))
                break
            why = unsafe_reason(raw, rel)
            if why:
                out.append(Finding("info.paths", ERROR, why, rel, int(ep[i])))
            elif not raw.fs.exists(raw.join(rel)):
                out.append(_missing_video(raw, rel, int(ep[i]), copy_source()))
    return out


def _copied_without_videos(raw: RawRoot) -> str | None:
    from episodekit.prep.outcopy import copied_without

    return copied_without(raw.fs, raw.path, "videos")


def _missing_video(raw: RawRoot, rel: str, episode: int, source: str | None) -> Finding:
    """``info.videos`` for a missing video file: an error, but a warning in a copy ``prepare
    --out`` made without ``--videos`` (data and metadata only, as its record says: ``source``,
    its source; prepare's own validation leaves the videos out), naming the option that copies
    them."""
    if source is None:
        return Finding("info.videos", ERROR, "referenced video file is missing", rel, episode)
    why = (
        f"referenced video file is not here: a copy of {source} made without --videos "
        f"(`episodekit prepare {source} --out {raw.root} --videos` copies them)"
    )
    return Finding("info.videos", WARNING, why, rel, episode)


def check_unreferenced(raw: RawRoot) -> list[Finding]:
    """``info.unreferenced``: every parquet file under data/ is referenced by some episode."""
    if raw.episodes is None:
        return []
    found = {raw.rel(p) for p in list_files(raw.fs, raw.join("data"), 2, ".parquet")}
    referenced = set(raw.data_files())
    out = []
    for f in sorted(found - referenced):
        msg = "data file is not referenced by any episode"
        if not has_footer(raw, f):  # the recorder's open file: its episodes were never flushed
            msg += f" and has no parquet footer ({repair_hint(raw.root)})"
        out.append(Finding("info.unreferenced", ERROR, msg, f))
    return out


def _scalar_ok(t: pa.DataType, dtype: str) -> bool:
    simple = {
        "float32": pa.float32(),
        "float64": pa.float64(),
        "int64": pa.int64(),
        "int32": pa.int32(),
        "int16": pa.int16(),
        "int8": pa.int8(),
        "uint8": pa.uint8(),
        "bool": pa.bool_(),
    }
    if dtype in simple:
        return t == simple[dtype]
    if dtype == "string":
        return pa.types.is_string(t) or pa.types.is_large_string(t)
    return True  # a dtype we do not know: not checked


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)


def _nested_problem(name: str, dtype: str, shape: list, t: pa.DataType) -> str | None:
    """A multi-dimensional feature: one list level per dimension (fixed sizes equal to the
    shape's), or one flat list of all the values; values of the declared dtype."""
    sizes, inner = [], t
    while _is_list(inner):
        sizes.append(inner.list_size if pa.types.is_fixed_size_list(inner) else None)
        inner = inner.value_type
    flat = len(sizes) == 1 and sizes[0] in (None, int(np.prod(shape)))
    nested = len(sizes) == len(shape) and all(s in (None, d) for s, d in zip(sizes, shape))
    if not (flat or nested):
        return f"feature {name}: shape {shape} stored as {t}"
    return None if _scalar_ok(inner, dtype) else f"feature {name}: {dtype} values stored as {inner}"


def feature_type_problem(name: str, feat: dict, t: pa.DataType) -> str | None:
    """Why arrow type ``t`` does not store feature ``feat`` (None when it does)."""
    dtype = feat.get("dtype")
    shape = list(feat.get("shape") or [1])
    if dtype == "image":
        ok = pa.types.is_struct(t) and t.get_field_index("bytes") >= 0
        return None if ok or pa.types.is_binary(t) else f"image feature {name} stored as {t}"
    if shape == [1] and not pa.types.is_list(t) and not pa.types.is_fixed_size_list(t):
        return None if _scalar_ok(t, dtype) else f"feature {name}: {dtype} stored as {t}"
    if _is_list(t) and len(shape) > 1:
        return _nested_problem(name, dtype, shape, t)
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        if len(shape) == 1 and pa.types.is_fixed_size_list(t) and t.list_size != shape[0]:
            return f"feature {name}: shape {shape} stored as {t}"
        inner = t.value_type
        if len(shape) == 1 and not _scalar_ok(inner, dtype):
            return f"feature {name}: {dtype} values stored as {inner}"
        return None
    return f"feature {name}: shape {shape} stored as {t}"


def check_features(raw: RawRoot, schemas: dict[str, pa.Schema]) -> list[Finding]:
    """``info.features``: every declared feature is a column of every data file, with a type
    that matches dtype and shape; undeclared columns are reported as warnings."""
    out = []
    declared = {k: f for k, f in raw.features.items() if isinstance(f, dict)}
    stored = {k: f for k, f in declared.items() if f.get("dtype") != "video"}
    if not declared:
        out.append(Finding("info.features", ERROR, "info.json declares no features", INFO))
    for rel, schema in schemas.items():
        names = set(schema.names)
        for name, feat in stored.items():
            if name not in names:
                out.append(
                    Finding("info.features", ERROR, f"declared feature {name} is missing", rel)
                )
                continue
            problem = feature_type_problem(name, feat, schema.field(name).type)
            if problem:
                out.append(Finding("info.features", ERROR, problem, rel))
        extra = sorted(names - set(declared))
        if extra:
            out.append(
                Finding(
                    "info.features",
                    WARNING,
                    f"undeclared columns {extra} (ignored by the loader)",
                    rel,
                )
            )
    return out


def local_or_fs_path(raw: RawRoot, rel: str) -> str:
    """Path as duckdb / pyarrow should open it."""
    full = raw.join(rel)
    if is_local(raw.fs):
        return full
    protocol = raw.fs.protocol if isinstance(raw.fs.protocol, str) else raw.fs.protocol[0]
    return f"{protocol}://{full}"
