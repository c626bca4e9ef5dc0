"""Artifact checks: ``meta/speed_percentiles.jsonl``, ``meta/episode_costs.parquet`` and every
``meta/shard_plans/*`` parse, are fresh (episodes fingerprint) and agree with a recomputation.

An absent artifact is not a finding; a present but stale or wrong one is an error. The writers'
own modules (speed, costs, plans) supply the formats and verify functions; the dataset they are
checked against is built from the raw tables, so this runs even when ``open_dataset`` would not.
"""

from __future__ import annotations

import io
import math
import posixpath

import jsonlines
import numpy as np
import pyarrow as pa

from episodekit.core.dataset import Dataset, DatasetError, list_files, parquet_from_bytes
from episodekit.core.paths import COST_FILE, PLAN_DIR, SPEED_FILE
from episodekit.core.words import plural
from episodekit.metadata.artifact import Problem, read_bytes
from episodekit.metadata.costs import COST_SCHEMA, recompute_costs, verify_costs
from episodekit.metadata.plans.build import verify_plan
from episodekit.metadata.plans.plan_file import PlanError, read_plan_file
from episodekit.metadata.speed import (
    NUM_BOUNDARIES,
    REQUIRED_KEYS,
    SPEED_VERSION,
    compute_speed_rows,
)
from episodekit.validate.raw import ERROR, Finding, RawRoot


def dataset_from_raw(raw: RawRoot) -> Dataset | None:
    """A :class:`Dataset` over the raw tables (episodes sorted, first copy of a repeated index),
    or None when the episodes or tasks could not be read."""
    if raw.episodes is None or raw.tasks is None:
        return None
    e = raw.episodes.sort_by("episode_index")
    ep = e["episode_index"].to_numpy()
    keep = np.r_[True, ep[1:] != ep[:-1]] if len(ep) else np.zeros(0, bool)
    e = e.filter(pa.array(keep))
    files = list(dict.fromkeys(e["data_file"].to_pylist()))
    pos = {f: i for i, f in enumerate(files)}
    file_id = np.array([pos[f] for f in e["data_file"].to_pylist()], dtype=np.int32)
    e = e.drop_columns(["__file", "data_file"]).append_column("file_id", pa.array(file_id))
    return Dataset(
        root=raw.root,
        fs=raw.fs,
        path=raw.path,
        info=raw.info,
        tasks=raw.tasks,
        episodes=e,
        data_files=files,
    )


def check_artifacts(raw: RawRoot, want: set[str]) -> list[Finding]:
    """All artifact findings (``speed.*``, ``costs.*``, ``plans.*``) for the selected ids."""
    ds = dataset_from_raw(raw)
    out: list[Finding] = []
    if any(c.startswith("speed.") for c in want):
        out += check_speed(raw, ds)
    if any(c.startswith("costs.") for c in want):
        out += check_costs(raw, ds)
    if any(c.startswith("plans.") for c in want):
        out += check_plans(raw, ds)
    return out


# ---------------------------------------------------------------------------------------------
# Speed percentiles


def check_speed(raw: RawRoot, ds: Dataset | None) -> list[Finding]:
    """``speed.format``, ``speed.fresh``, ``speed.content``."""
    full = raw.join(SPEED_FILE)
    if not raw.fs.exists(full):
        return []

    def err(check: str, msg: str) -> Finding:
        return Finding(check, ERROR, msg, SPEED_FILE)

    try:
        data = read_bytes(raw.root, SPEED_FILE) or b""
        rows = list(jsonlines.Reader(io.BytesIO(data)).iter(skip_empty=True))
    except (jsonlines.InvalidLineError, UnicodeDecodeError, OSError, DatasetError) as exc:
        return [err("speed.format", f"not valid JSON lines ({exc})")]
    out = []
    for i, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            return [err("speed.format", f"line {i}: expected a JSON object")]
        missing = [k for k in (*REQUIRED_KEYS, "version", "fingerprint") if k not in row]
        if missing:
            return [err("speed.format", f"line {i}: missing keys {missing}")]
        if row["version"] != SPEED_VERSION:
            return [err("speed.format", f"line {i}: version {row['version']!r}, expected 1")]
    if ds is None:
        return out
    stale = {r["fingerprint"] for r in rows} - {ds.fingerprint}
    if stale:
        return [
            err(
                "speed.fresh",
                f"stale: fingerprint {sorted(stale)[0]!r}, the episodes give {ds.fingerprint!r}; "
                f"recompute with `episodekit metadata speed {raw.root}`",
            )
        ]
    task_ids = [r["task_index"] for r in rows]
    expected_ids = ds.tasks["task_index"].to_pylist()
    if sorted(task_ids) != sorted(expected_ids):
        out.append(
            err(
                "speed.content",
                f"rows for task_index {sorted(task_ids)} but the tasks table has {expected_ids} "
                "(one row per task expected)",
            )
        )
    for i, row in enumerate(rows, start=1):
        p = row["percentiles"]
        if p is None:
            continue
        ok = (
            isinstance(p, list)
            and len(p) == NUM_BOUNDARIES
            and all(isinstance(x, (int, float)) and math.isfinite(x) for x in p)
        )
        if not ok:
            out.append(err("speed.content", f"line {i}: percentiles must be null or 10 numbers"))
        elif any(b < a for a, b in zip(p, p[1:])):
            out.append(err("speed.content", f"line {i}: boundaries not ascending: {p}"))
    if out:
        return out
    return out + _speed_recomputed(raw, ds, rows, err)


def _speed_recomputed(raw: RawRoot, ds: Dataset, rows: list[dict], err) -> list[Finding]:
    try:
        expected = {r["task_index"]: r for r in compute_speed_rows(ds)}
    except (DatasetError, ValueError, KeyError) as exc:
        return [err("speed.content", f"cannot recompute the percentiles: {exc}")]
    out = []
    for row in rows:
        exp = expected.get(row["task_index"])
        if exp is None:
            continue
        got, want = row["percentiles"], exp["percentiles"]
        t = row["task_index"]
        if (got is None) != (want is None):
            state = "sparse" if want is None else "not sparse"
            out.append(
                err(
                    "speed.content",
                    f"task {t}: percentiles must be null exactly for sparse tasks; task is {state}",
                )
            )
        elif got is not None and not np.allclose(got, want, rtol=1e-9, atol=1e-9):
            out.append(err("speed.content", f"task {t}: boundaries {got} != recomputed {want}"))
        elif row["n_episodes"] != exp["n_episodes"]:
            out.append(
                err(
                    "speed.content",
                    f"task {t}: n_episodes {row['n_episodes']} != {exp['n_episodes']}",
                )
            )
    return out


# ---------------------------------------------------------------------------------------------
# Episode costs


def _coverage(episodes: np.ndarray, ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """(dataset episodes missing from ``episodes``, episodes listed more than once)."""
    uniq, counts = np.unique(episodes, return_counts=True)
    missing = np.setdiff1d(ds.column("episode_index"), uniq)
    return missing, uniq[counts > 1]


def check_costs(raw: RawRoot, ds: Dataset | None) -> list[Finding]:
    """``costs.format``, ``costs.fresh``, ``costs.content``."""
    full = raw.join(COST_FILE)
    if not raw.fs.exists(full):
        return []
    try:
        table = parquet_from_bytes(read_bytes(raw.root, COST_FILE) or b"")
    except (pa.ArrowException, OSError, DatasetError) as exc:
        return [Finding("costs.format", ERROR, f"unreadable cost table ({exc})", COST_FILE)]
    if ds is None:
        return []
    out = [Finding(f"costs.{p.kind}", ERROR, str(p), COST_FILE) for p in verify_costs(table, ds)]
    if any(f.check != "costs.content" for f in out):
        return out  # stale or malformed: a content comparison means nothing
    missing, repeated = _coverage(table["episode_index"].to_numpy(), ds)
    for name, eps in (("missing", missing), ("listed more than once", repeated)):
        if len(eps):
            out.append(
                Finding(
                    "costs.content",
                    ERROR,
                    f"{plural(len(eps), 'episode')} {name}: {eps[:10].tolist()}",
                    COST_FILE,
                    int(eps[0]),
                )
            )
    if out:
        return out
    try:
        fresh = recompute_costs(table, ds)
    except (DatasetError, OSError, ValueError, pa.ArrowException) as exc:
        return [Finding("costs.content", ERROR, f"cannot recompute costs: {exc}", COST_FILE)]
    for col in COST_SCHEMA.names:
        a = table[col].to_numpy().astype(np.float64)
        b = fresh[col].to_numpy().astype(np.float64)
        bad = np.flatnonzero(~np.isclose(a, b, rtol=1e-9, atol=1e-9, equal_nan=True))
        if len(bad):
            ep = int(table["episode_index"][int(bad[0])].as_py())
            out.append(
                Finding(
                    "costs.content",
                    ERROR,
                    f"{col} differs from a recomputation for {plural(len(bad), 'episode')} "
                    f"(episode {ep}: stored {a[bad[0]]}, recomputed {b[bad[0]]})",
                    COST_FILE,
                    ep,
                )
            )
    return out


# ---------------------------------------------------------------------------------------------
# Shard plans


def check_plans(raw: RawRoot, ds: Dataset | None) -> list[Finding]:
    """``plans.format``, ``plans.fresh``, ``plans.content`` for every file in the plan folder."""
    folder = raw.join(PLAN_DIR)
    if not raw.fs.exists(folder):
        return []
    out = []
    for full in list_files(raw.fs, folder, 1):
        rel = raw.rel(full)
        if posixpath.basename(full).startswith("."):
            continue
        try:
            plan = read_plan_file(raw.fs, full)
        except (PlanError, OSError, KeyError, TypeError, ValueError) as exc:
            out.append(Finding("plans.format", ERROR, str(exc), rel))
            continue
        if ds is None:
            continue
        missing, _ = _coverage(plan.items[:, 0], ds)
        try:
            problems = verify_plan(plan, ds)
        except (DatasetError, OSError, ValueError, KeyError, pa.ArrowException) as exc:
            problems = [Problem(f"cannot verify the plan: {exc}")]
        for p in problems:
            check = f"plans.{p.kind}"
            episode = int(missing[0]) if len(missing) and check == "plans.content" else None
            out.append(Finding(check, ERROR, str(p), rel, episode))
    return out
