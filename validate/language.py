"""LeRobot's language columns (LeRobot main after 0.6.1, written by ``lerobot-annotate``):
``data.language`` checks every row of ``language_persistent`` and ``language_events`` (a feature
of dtype ``language`` in info.json) against what LeRobot's own validator and readers expect.

- the column is a list of structs with exactly LeRobot's fields: ``role`` (string, never null),
  ``content`` (string or null), ``style`` (string or null), ``camera`` (string or null),
  ``tool_calls`` (a list or null), and in ``language_persistent`` a float ``timestamp``;
- ``style`` is one of LeRobot's styles (:data:`CORE_STYLES`) or one declared in the feature's
  ``styles`` list in info.json, and belongs to its column (persistent styles in
  ``language_persistent``; event styles and null, a tool-call atom, in ``language_events``);
- ``camera`` is set exactly for view-dependent styles (``vqa``, ``trace``) and names an
  ``observation.images.*`` feature of the dataset;
- a persistent row's ``timestamp`` lies inside its episode (between the episode's first and
  last frame timestamps).

Each violation is an error (one finding per file, kind of problem and episode, with a count).
The columns are read as Arrow and checked with vectorized compute, never row by row in Python.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core import interrupt
from episodekit.core.dataset import read_parquet
from episodekit.validate.raw import ERROR, Finding, RawRoot, unreadable_parquet

PERSISTENT, EVENTS = "language_persistent", "language_events"
PERSISTENT_STYLES = {"subtask", "plan", "memory", "motion", "task_aug"}
EVENT_STYLES = {"interjection", "vqa", "trace"}
CORE_STYLES = PERSISTENT_STYLES | EVENT_STYLES
VIEW_DEPENDENT = {"vqa", "trace"}
EVENT_FIELDS = ("role", "content", "style", "camera", "tool_calls")
PERSISTENT_FIELDS = ("role", "content", "style", "timestamp", "camera", "tool_calls")
TOLERANCE_S = 1e-4


def language_columns(features: dict) -> list[str]:
    """The features of dtype ``language`` (LeRobot's two columns, or others declared so)."""
    return [k for k, f in features.items() if isinstance(f, dict) and f.get("dtype") == "language"]


def check_language(raw: RawRoot, rels: list[str]) -> list[Finding]:
    """``data.language`` findings of every data file in ``rels`` (relative paths)."""
    columns = language_columns(raw.features)
    if not columns:
        return []
    cameras = {k for k in raw.features if k.startswith("observation.images.")}
    out: list[Finding] = []
    for rel in rels:
        interrupt.check()
        try:
            table = read_parquet(raw.fs, raw.join(rel), ["episode_index", "timestamp", *columns])
        except Exception as exc:  # reported by data.read / info.features already
            if "episode_index" in str(exc) or "timestamp" in str(exc):
                continue
            out.append(Finding("data.language", ERROR, unreadable_parquet(exc, raw.root), rel))
            continue
        for col in columns:
            if col not in table.column_names:
                continue  # info.features reports a declared column missing from a file
            feature = raw.features[col]
            styles = CORE_STYLES | set(feature.get("styles") or ())
            problems = _column_problems(col, table, styles, cameras)
            for (what, episode), count in sorted(problems.items(), key=_order):
                rows = f"{count} row{'s' if count != 1 else ''}"
                out.append(Finding("data.language", ERROR, f"{col}: {what} ({rows})", rel, episode))
    return out


def _order(item: tuple) -> tuple:
    (what, episode), _ = item
    return (-1 if episode is None else episode, what)


def _column_problems(
    col: str, table: pa.Table, styles: set[str], cameras: set[str]
) -> dict[tuple[str, int | None], int]:
    """(problem, episode) -> number of language rows with it, for one column of one file."""
    arr = table.column(col).combine_chunks()
    t = arr.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_struct(
        t.value_type
    ):
        return {(f"not a list of structs but {t}", None): len(arr)}
    persistent = col == PERSISTENT or (col != EVENTS and "timestamp" in _names(t.value_type))
    want = PERSISTENT_FIELDS if persistent else EVENT_FIELDS
    have = _names(t.value_type)
    if sorted(have) != sorted(want):
        missing = [f for f in want if f not in have]
        extra = [f for f in have if f not in want]
        parts = [f"missing {', '.join(missing)}"] if missing else []
        parts += [f"unknown {', '.join(extra)}"] if extra else []
        what = "row fields " + "; ".join(parts)
        return {(what, None): len(arr)}
    types = _type_problems(t.value_type, persistent)
    if types:
        return {(f"field types: {'; '.join(types)}", None): len(arr)}
    rows = arr.flatten()  # one struct per language row
    parent = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
    episodes = table.column("episode_index").to_numpy()[parent]
    out: dict[tuple[str, int | None], int] = {}

    def add(mask: np.ndarray, what: str) -> None:
        if mask.any():
            eps, counts = np.unique(episodes[mask], return_counts=True)
            for e, c in zip(eps.tolist(), counts.tolist()):
                out[(what, int(e))] = out.get((what, int(e)), 0) + int(c)

    add(_np(pc.is_null(rows.field("role"))), "role is null")
    style, camera = rows.field("style"), rows.field("camera")
    known = _in(style, styles) | _np(pc.is_null(style))
    for s in _values(style, ~known):
        add(~known & _eq(style, s), f"unknown style {s!r} (declare it in info.json "
            f"features.{col}.styles)")  # fmt: skip
    if persistent:
        belongs = _in(style, PERSISTENT_STYLES)
    else:
        belongs = _in(style, EVENT_STYLES) | _np(pc.is_null(style))
    where = "language_events" if persistent else "language_persistent"
    for s in _values(style, known & ~belongs):
        add(known & ~belongs & _eq(style, s), f"style {s!r} belongs in {where}")
    has_camera = ~_np(pc.is_null(camera))
    view = _in(style, VIEW_DEPENDENT)
    add(view & ~has_camera, "a vqa/trace row without camera (it must name the view)")
    add(~view & has_camera, "camera set on a style that is not view-dependent (vqa, trace)")
    bad_camera = has_camera & ~_in(camera, cameras)
    for c in _values(camera, bad_camera):
        add(bad_camera & _eq(camera, c), f"camera {c!r} is not an observation.images.* "
            "feature of this dataset")  # fmt: skip
    if persistent:
        ts = rows.field("timestamp")
        ts_np = ts.to_numpy(zero_copy_only=False).astype(np.float64)
        add(_np(ts.is_null()), "timestamp is null")
        lo, hi = _episode_bounds(table)
        k = np.searchsorted(lo[0], episodes)
        k = np.minimum(k, max(len(lo[0]) - 1, 0))
        first, last = lo[1][k], hi[k]
        outside = ~np.isnan(ts_np) & ((ts_np < first - TOLERANCE_S) | (ts_np > last + TOLERANCE_S))
        add(outside, "timestamp outside its episode")
    return out


def _episode_bounds(table: pa.Table) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """((episodes, first frame timestamp), last frame timestamp) of the file's episodes."""
    ep = table.column("episode_index").to_numpy()
    ts = table.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64)
    order = np.argsort(ep, kind="stable")
    eps, start = np.unique(ep[order], return_index=True)
    first = np.minimum.reduceat(ts[order], start) if len(start) else ts[:0]
    last = np.maximum.reduceat(ts[order], start) if len(start) else ts[:0]
    return (eps, first), last


def _names(t: pa.StructType) -> list[str]:
    return [t.field(i).name for i in range(t.num_fields)]


def _type_problems(t: pa.StructType, persistent: bool) -> list[str]:
    """What differs from LeRobot's field types (strings, a float timestamp, a list of calls);
    a null type (a column whose values are all null) fits any nullable field."""
    out = []
    for name in ("role", "content", "style", "camera"):
        ft = t.field(name).type
        if not (pa.types.is_string(ft) or pa.types.is_large_string(ft) or pa.types.is_null(ft)):
            out.append(f"{name} is {ft}, not a string")
    calls = t.field("tool_calls").type
    if not (pa.types.is_list(calls) or pa.types.is_large_list(calls) or pa.types.is_null(calls)):
        out.append(f"tool_calls is {calls}, not a list")
    if persistent:
        ft = t.field("timestamp").type
        if not pa.types.is_floating(ft):
            out.append(f"timestamp is {ft}, not a float")
    return out


def _np(mask: Any) -> np.ndarray:
    return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)


def _in(values: pa.Array, allowed: set) -> np.ndarray:
    """Per value: a non-null string in ``allowed`` (False for nulls and all-null columns)."""
    if pa.types.is_null(values.type) or not allowed:
        return np.zeros(len(values), dtype=bool)
    hit = pc.is_in(values, value_set=pa.array(sorted(allowed), type=values.type))
    return _np(pc.fill_null(hit, False))


def _eq(values: pa.Array, value: str) -> np.ndarray:
    return _np(pc.fill_null(pc.equal(values, pa.scalar(value, values.type)), False))


def _values(values: pa.Array, mask: np.ndarray) -> list[str]:
    """The distinct non-null values where ``mask`` holds, sorted (for one finding each)."""
    if not mask.any() or pa.types.is_null(values.type):
        return []
    picked = pc.unique(values.filter(pa.array(mask))).drop_null()
    return sorted(picked.to_pylist())
