"""How much of a root a validation reads: everything (the default), its metadata only
(``--metadata-only``), or its metadata plus the data pages of a few sampled episodes
(``--sample-episodes N``): what CI can afford on a hub or HTTP root.

Metadata is ``meta/`` (info.json, tasks, episodes, stats, artifacts), every data file's parquet
footer, and every mp4's top-level box headers and ``moov`` box (read through range requests; no
data page, no video frame). Every check decided by those runs, with the same findings a full run
gives; the checks that need data pages or video frames (the registry's ``Check.reads``) are
skipped and the report lists them with the reason (:func:`skipped_checks`); two run in part
(:data:`PARTIAL`).

The sample (:func:`sample_episodes`) is deterministic: the first and the last episode, then the
episodes with the smallest ``splitmix64(episode_index xor seed)``, a seeded hash of the index
alone, so the same root and seed give the same episodes on every run and machine, spread over the
whole dataset. Only the row groups that hold them are read (chosen from the footers'
``episode_index`` statistics; a file without them is read whole, and said so), and the data checks
(:data:`SAMPLED`) judge those episodes as a full run would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from episodekit.core import interrupt
from episodekit.core.footer import file_layout
from episodekit.core.parquet_read import DataFile, is_local, open_data_file, read_footer
from episodekit.core.remote import open_ranged
from episodekit.core.words import plural
from episodekit.validate import checks as registry
from episodekit.validate.raw import ERROR, Finding, RawRoot

FULL, METADATA, SAMPLE = "full", "metadata-only", "sample"
# Data checks a sample's row groups decide for its episodes (the per-episode scan); what each
# check reads is the registry's (episodekit.validate.checks, Check.reads).
SAMPLED = tuple(c.id for c in registry.REGISTRY if c.reads == registry.EPISODE_PAGES)
# Why a check that reads more than the metadata is not run (a sample's own reasons below).
NOT_RUN = {
    registry.FRAMES: "(decodes every video frame)",
    registry.STATS_PAGES: "(recomputes the stats from every data page)",
    registry.DATASET_PAGES: "(reads every data page: dataset-wide signal statistics)",
}
PARTIAL = {
    "data.read": "the parquet footers only",
    "info.fps": "info.json and the videos only (no data timestamp)",
}
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Scope:
    """What one run reads: ``metadata_only``, or metadata plus ``sample`` episodes' pages."""

    metadata_only: bool = False
    sample: int | None = None
    seed: int = DEFAULT_SEED

    @property
    def full(self) -> bool:
        return not self.metadata_only and self.sample is None

    @property
    def mode(self) -> str:
        return FULL if self.full else SAMPLE if self.sample is not None else METADATA


def skipped_checks(scope: Scope, selected: Iterable[str]) -> dict[str, str]:
    """The selected checks this scope does not run, each with the reason."""
    if scope.full:
        return {}
    out = {}
    for check in selected:
        reads = registry.get(check).reads
        if reads == registry.METADATA or (
            scope.sample is not None and reads == registry.EPISODE_PAGES
        ):
            continue
        if reads in NOT_RUN:
            out[check] = NOT_RUN[reads]
        elif scope.sample is not None:
            out[check] = "(reads every data file, not a sample's row groups)"
        else:
            out[check] = "(reads data pages)"
    return out


def partial_checks(scope: Scope, selected: Iterable[str], episodes: int) -> dict[str, str]:
    """The selected checks this scope runs in part, each with what it covers."""
    if scope.full:
        return {}
    out = {c: why for c, why in PARTIAL.items() if c in selected}
    if scope.sample is not None:
        only = f"the {plural(episodes, 'sampled episode')} only"
        out["data.read"] = f"the parquet footers and the row groups of {only}"
        out["info.fps"] = f"info.json, the videos and the timestamps of {only}"
        out.update({c: only for c in SAMPLED if c in selected})
    return {c: out[c] for c in selected if c in out}


def scope_lines(report: Any) -> list[str]:
    """What a metadata-only or sampled run read and left out, one line each (none for a full
    run): the sample, the checks not run and run in part grouped by reason, the notes. Read
    from a :class:`~episodekit.validate.runner.Report` by every output format."""
    out = []
    if report.sample is not None:
        more = ", ..." if len(report.sample) > 20 else ""
        shown = ", ".join(map(str, report.sample[:20])) + more
        out.append(f"sampled {plural(len(report.sample), 'episode')} (seed {report.seed}): {shown}")
    for label, checks in (("not run", report.checks_skipped), ("run on", report.checks_partial)):
        by_reason: dict[str, list[str]] = {}
        for check, why in checks.items():
            by_reason.setdefault(why, []).append(check)
        out += [f"{label} {why}: {', '.join(ids)}" for why, ids in by_reason.items()]
    return out + [f"note: {note}" for note in report.notes]


def settle(scope: Scope, raw: RawRoot, want: set[str], skipped: dict[str, str]) -> list[int]:
    """What the root read allows: ``info.unreferenced`` moves from ``want`` to ``skipped`` on a
    root that cannot be listed; the sampled episodes (none without ``--sample-episodes`` or an
    episodes table)."""
    if not raw.listable and "info.unreferenced" in want:
        skipped["info.unreferenced"] = "(the root cannot be listed: no folder pages)"
        want.discard("info.unreferenced")
    if scope.sample is None or raw.episodes is None:
        return []
    return sample_episodes(raw.episodes["episode_index"].to_numpy(), scope.sample, scope.seed)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A well-mixed 64-bit hash of each value (SplitMix64's finalizer), wrapping arithmetic."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sample_episodes(episode_index: Sequence[int] | np.ndarray, n: int, seed: int = 0) -> list[int]:
    """``n`` distinct episodes of ``episode_index``, the same on every run: the first and the
    last, then the smallest ``splitmix64(episode_index xor seed)`` (sorted ascending)."""
    eps = np.unique(np.asarray(episode_index, dtype=np.int64))
    if n <= 0 or len(eps) == 0:
        return []
    if n >= len(eps):
        return eps.tolist()
    ends = eps[[0, -1]][: min(n, 2)]
    rest = eps[1:-1]
    with np.errstate(over="ignore"):
        h = _splitmix64(rest.view(np.uint64) ^ np.uint64(seed & 0xFFFFFFFFFFFFFFFF))
    picked = rest[np.argsort(h, kind="stable")[: n - len(ends)]]
    return np.unique(np.concatenate([ends, picked])).tolist()


def _groups_of(raw: RawRoot, rel: str, episodes: np.ndarray) -> tuple[list[int] | None, int]:
    """Row groups of ``rel`` that may hold ``episodes`` (None: every group, the footer has no
    ``episode_index`` statistics) and the number of groups."""
    lay = file_layout(raw.join(rel), raw.fs)
    if lay.episode_min is None:
        return None, lay.num_row_groups
    lo = np.searchsorted(episodes, lay.episode_min, side="left")
    hi = np.searchsorted(episodes, lay.episode_max, side="right")
    return np.flatnonzero(hi > lo).tolist(), lay.num_row_groups


def _read_groups(raw: RawRoot, rel: str, groups: list[int] | None) -> pa.Table:
    """Row groups ``groups`` (None: all) of a data file, with ``filename`` (``rel``) and
    ``file_row_number``; a remote file through one range read per column chunk."""
    full = raw.join(rel)
    meta = read_footer(full, raw.fs)
    rows = np.array([meta.row_group(i).num_rows for i in range(meta.num_row_groups)], np.int64)
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
    groups = list(range(meta.num_row_groups)) if groups is None else groups
    if is_local(raw.fs):
        with open_data_file(full, raw.fs) as df:
            table = df.read_row_groups(groups)
    else:  # synchronous range reads of the groups' column chunks, no read-ahead
        with open_ranged(raw.fs, full) as fh, DataFile.of(full, fh, meta, pre_buffer=False) as df:
            table = df.read_row_groups(groups, use_threads=False)
    number = np.concatenate([np.arange(starts[g], starts[g] + rows[g]) for g in groups] or [[]])
    table = table.append_column("filename", pa.array([rel] * table.num_rows, pa.string()))
    return table.append_column("file_row_number", pa.array(number.astype(np.int64)))


def scan_sample(
    raw: RawRoot, schemas: dict[str, pa.Schema], episodes: list[int], deep: bool = False
) -> tuple[pl.DataFrame | None, list[Finding], list[str], set[str]]:
    """The data scan's per-(file, episode) aggregates over the row groups holding ``episodes``:
    (aggregates, ``data.read`` findings, notes, files read). ``file`` is relative to the root."""
    from episodekit.validate.data import scan_options, scan_table

    if raw.fps is None or raw.episodes is None or not episodes:
        return None, [], [], set()
    e = raw.episodes.select(["episode_index", "data_file"]).to_pydict()
    wanted = set(episodes)
    files: dict[str, list[int]] = {}
    for ep, rel in zip(e["episode_index"], e["data_file"]):
        if ep in wanted and rel in schemas:
            files.setdefault(rel, []).append(ep)
    stored, shapes = scan_options(raw)
    parts, problems, notes, read = [], [], [], set()
    for rel, eps in files.items():
        interrupt.check()
        if "episode_index" not in schemas[rel].names:
            continue  # reported by info.features; nothing to group by
        try:
            groups, n = _groups_of(raw, rel, np.unique(np.asarray(eps, np.int64)))
            if groups is None:
                whole = plural(n, "row group")
                notes.append(f"{rel}: no episode_index statistics, all {whole} read")
            table = _read_groups(raw, rel, groups)
            parts.append(scan_table(table, raw.fps, stored, shapes, deep))
        except Exception as exc:  # noqa: BLE001 - any reader failure is the file's fault
            interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
            problems.append(Finding("data.read", ERROR, f"unreadable data: {exc}", rel))
            continue
        read.add(rel)
    if not parts:
        return None, problems, notes, read
    return pl.concat(parts, how="diagonal_relaxed"), problems, notes, read
