"""What ``episodekit repair`` will do with a root: each damage found, each episode kept (with its
metadata row recovered from disk or rebuilt from its rows) or dropped and why, and what becomes
of every file. Decided from an :class:`~episodekit.writers.repair_inspect.Inventory`, before
anything is written; ``--dry-run`` prints it.

The rules (LeRobot's recorder saves an episode as: rows appended to the open data file, each
camera's mp4 appended, metadata row buffered, info.json and stats.json rewritten):

- an episode is *saved* when info.json counts it (``episode_index < total_episodes``) or its
  metadata row reached the disk; a later one whose rows did reach the disk was being saved
  when the recorder died: dropped (``--keep-partial`` keeps it when its rows and every
  camera's frames are whole);
- a saved episode is kept when all its rows are on disk (in whole row groups) and every
  camera's mp4 holds all its frames; otherwise it is dropped, never kept with missing frames;
- its metadata row is the recovered one when that agrees with the rows (length, first index,
  data file), else rebuilt from the rows and the mp4s;
- kept episodes must stay ``0..N-1`` with their rows in order; when a drop leaves a gap, the
  output is renumbered (written by the dataset writer, as ``edit`` does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core.errors import DatasetError
from episodekit.core.words import noun_for
from episodekit.writers import repair_schema
from episodekit.writers.repair_columns import RecoveredColumns
from episodekit.writers.repair_inspect import DataFile, Inventory, VideoState
from episodekit.writers.repair_kept import Episode, Kept, column, task_lists

HALF = 0.5  # of a frame: where a frame belongs when its time sits near a boundary


@dataclass
class Dropped:
    episode: int
    frames: int  # rows of it on disk
    reason: str


@dataclass
class RepairPlan:
    """See the module docstring. ``damages``: (file, what) pairs, in the order found."""

    inventory: Inventory
    damages: list[tuple[str, str]]
    kept: Sequence[Episode]  # a :class:`~episodekit.writers.repair_kept.Kept` (columns)
    dropped: list[Dropped]
    recovered: RecoveredColumns | None  # the plan's columns of every recovered metadata row
    tasks: list[str]  # the output's tasks (task_index order)
    staged: dict[str, int]  # what is left behind: "PNG files", "episode mp4s" -> count
    stats_reason: str = ""  # why stats.json is rebuilt ("" keeps it)

    @property
    def needs_renumbering(self) -> bool:
        return not np.array_equal(column(self.kept, "index"), np.arange(len(self.kept)))

    @property
    def healthy(self) -> bool:
        return not self.damages

    @property
    def frames(self) -> int:
        return int(column(self.kept, "length").sum())


def _recovered(inv: Inventory) -> RecoveredColumns | None:
    return inv.recovered if inv.recovered.num_rows else None


class _Lookup(Mapping):
    """A read-only ``episode -> value`` mapping over sorted episodes (numpy), each value made
    when asked: no Python object per episode held (100,000 episodes: ~30 MB of dicts)."""

    def __init__(self, keys: np.ndarray, value: Callable[[int], Any]) -> None:
        self.keys, self.value = keys, value

    def _at(self, ep: object) -> int:
        if not isinstance(ep, (int, np.integer)):
            return -1
        i = int(np.searchsorted(self.keys, ep))
        return i if i < len(self.keys) and self.keys[i] == ep else -1

    def __getitem__(self, ep: int) -> Any:
        i = self._at(ep)
        if i < 0:
            raise KeyError(ep)
        return self.value(i)

    def __contains__(self, ep: object) -> bool:
        return self._at(ep) >= 0

    def __iter__(self):
        return iter(self.keys.tolist())

    def __len__(self) -> int:
        return len(self.keys)


def _data_runs(inv: Inventory, damages: list) -> _Lookup:
    """episode_index -> (data file, run) of every whole episode found in the data (the first
    run of an episode found twice)."""
    eps = [df.episode.astype(np.int64) for df in inv.data]
    all_ep = np.concatenate(eps) if eps else np.zeros(0, np.int64)
    file_of = np.repeat(np.arange(len(eps)), [len(e) for e in eps])
    run_of = np.concatenate([np.arange(len(e)) for e in eps]) if eps else all_ep
    keys, first = np.unique(all_ep, return_index=True)
    again = np.ones(len(all_ep), bool)
    again[first] = False
    at = 0
    for f, df in enumerate(inv.data):
        what = df.damage()
        if what:
            damages.append((df.rel, what))
        if df.index_gaps:
            damages.append((df.rel, f"index skips values in {df.index_gaps} places"))
        for k in np.flatnonzero(again[at : at + len(eps[f])]).tolist():
            ep = int(all_ep[at + k])
            was = inv.data[int(file_of[first[np.searchsorted(keys, ep)]])].rel
            damages.append((df.rel, f"episode {ep} appears again (first in {was})"))
        at += len(eps[f])
    files, runs = file_of[first], run_of[first]
    return _Lookup(keys, lambda i: (inv.data[int(files[i])], int(runs[i])))


def _meta_disagrees(row: dict, df: DataFile, r: int) -> str:
    """How a recovered metadata row disagrees with the episode's rows ("" when it agrees)."""
    if row["length"] != df.rows[r]:
        return f"its length is {row['length']} but it has {int(df.rows[r])} rows"
    if row["dataset_from_index"] != df.first_index[r]:
        return f"dataset_from_index {row['dataset_from_index']} but its first index is " + str(
            int(df.first_index[r])
        )
    if (row["data/chunk_index"], row["data/file_index"]) != (df.chunk, df.file):
        return f"it names data file {row['data/chunk_index']}/{row['data/file_index']}"
    return ""


class _Cursor:
    """Where the next episode of one camera starts: a file of the camera and a frame in it."""

    def __init__(self, files: list[VideoState]):
        self.files = files
        self.at = 0  # position in ``files``
        self.frame = 0
        self.time = 0.0  # to_timestamp of the episode before, in that file

    def frames_before(self, f: VideoState, t: float) -> int:
        return int(np.searchsorted(f.pts * f.time_base, t - HALF * f.frame_ticks * f.time_base))

    def place_recovered(self, chunk: int, file: int, start: float, stop: float, n: int) -> str:
        pos = next((i for i, f in enumerate(self.files) if (f.chunk, f.file) == (chunk, file)), -1)
        if pos < 0:
            return f"its mp4 (chunk {chunk}, file {file}) is missing"
        f = self.files[pos]
        a, b = self.frames_before(f, start), self.frames_before(f, stop)
        if b - a != n:
            return f"{f.rel} holds {b - a} of its {n} frames" + (
                f" ({f.problem})" if f.problem else ""
            )
        self.at, self.frame, self.time = pos, b, stop
        return _cut_off(f, b)

    def place_next(self, n: int) -> tuple[tuple[int, int, float, float] | None, str]:
        """The next ``n`` frames: the rest of the current file, else the next file's start."""
        while self.at < len(self.files):
            f = self.files[self.at]
            left = f.frames - self.frame
            if left > 0:
                if left < n:
                    return None, f"{f.rel} holds {left} of its {n} frames"
                a, b = self.frame, self.frame + n
                end = f.pts[b] if b < f.frames else f.pts[-1] + f.frame_ticks
                # LeRobot: previous to_timestamp + float(episode duration ticks * time_base)
                stop = self.time + float((int(end) - int(f.pts[a])) * f.time_base)
                place = (f.chunk, f.file, self.time, stop)
                self.frame, self.time = b, stop
                why = _cut_off(f, b)  # placed (the next episode starts after it) but not whole
                return (None, why) if why else (place, "")
            if self.frame == 0 and f.problem:
                return None, f"{f.rel} is unreadable ({f.problem})"
            self.at, self.frame, self.time = self.at + 1, 0, 0.0
        return None, "its frames are in no mp4"


def _cut_off(f: VideoState, end: int) -> str:
    """Why frames before ``end`` of ``f`` are not all there ("" when they are)."""
    if end <= f.whole:
        return ""
    return f"{f.rel} lost the bytes of {end - f.whole} of its frames (cut off the end)"


def plan_repair(inv: Inventory, keep_partial: bool = False) -> RepairPlan:
    """Decide what to keep, rebuild and drop (see the module docstring). Once per
    ``inv``: the recovered columns only the plan reads are let go when it is made."""
    damages: list[tuple[str, str]] = list(inv.info_damages)
    for m in inv.episodes:
        what = m.damage()
        if what:
            damages.append((m.rel, what))
    no_file = ("meta/episodes", "no episodes file (the recorder never flushed one)")
    if not inv.episodes:
        damages.append(no_file)
    runs = _data_runs(inv, damages)
    recovered = _recovered(inv)
    rows = _Lookup(np.zeros(0, np.int64), int)  # episode -> its first recovered row
    columns: dict[str, Callable[[int], Any]] = {}  # the recovered columns the plan reads
    if recovered is not None:
        keys, first = np.unique(recovered.episode_index(), return_index=True)
        rows = _Lookup(keys, lambda i: int(first[i]))
        columns = recovered.getters()
        file_of, rels = recovered.file_of, [m.rel for m in inv.episodes]
        columns["__file"] = lambda i: rels[file_of[i]]
    saved_count = _count(inv.info.get("total_episodes"))
    if saved_count is None:  # info.json cut short (LeRobot rewrites it in place) or damaged
        saved_count = _saved_from_stats(inv, runs, columns.get("length"), rows)
    tasks = inv.tasks["task"].to_pylist() if inv.tasks is not None else []
    candidates = np.union1d(runs.keys, rows.keys)
    kept = Kept(inv.data, list(inv.videos), capacity=len(candidates))
    dropped: list[Dropped] = []
    cursors = {k: _Cursor(files) for k, files in inv.videos.items()}
    shared: dict[tuple, list[str]] = {}  # one list per set of tasks, not one per episode
    for ep in candidates.tolist():
        ri = rows.get(ep)
        row = {c: value(ri) for c, value in columns.items()} if ri is not None else None
        if ep not in runs:
            n = int(row["length"]) if row else 0
            why = "zero-length episode" if n == 0 else "its rows are not in the data files"
            dropped.append(Dropped(ep, 0, why))
            continue
        df, r = runs[ep]
        n = int(df.rows[r])
        if row is None and (saved_count is None or ep >= saved_count) and not keep_partial:
            why = "never saved: the recorder died while saving it (--keep-partial keeps it)"
            if saved_count is None:
                why = (
                    "no metadata row, and info.json's total_episodes cannot tell whether it "
                    "was saved (--keep-partial keeps it)"
                )
            dropped.append(Dropped(ep, n, why))
            continue
        if row is not None and n < row["length"] and not df.intact:
            dropped.append(Dropped(ep, n, f"{n} of its {row['length']} rows are on disk"))
            continue
        e = Episode(ep, n, int(df.first_index[r]), df, r, ri, ri)
        if row is not None:
            e.why_rebuilt = _meta_disagrees(row, df, r)
            if e.why_rebuilt:
                damages.append((row["__file"], f"episode {ep}: {e.why_rebuilt}"))
                e.meta_row = None
            e.tasks = shared.setdefault(tuple(row["tasks"] or ()), list(row["tasks"] or []))
        else:
            e.why_rebuilt = "its metadata row never reached the disk"
        if not e.tasks:
            e.tasks = _episode_tasks(inv, df, r, tasks)
        why = _place_videos(e, row, cursors)
        if why:
            dropped.append(Dropped(ep, n, why))
            continue
        kept.append(e)
    no_row = (column(kept, "meta_row") < 0) & (column(kept, "source_row") < 0)
    lost = column(kept, "index")[no_row].tolist()
    if lost:  # whatever the footers say: every file may be whole (the writer rolled over)
        if no_file in damages:  # one line says both
            damages.remove(no_file)
        damages.append(("meta/episodes", _no_rows(lost, no_file[1] if not inv.episodes else "")))
    if recovered is not None:  # what is read after the plan: each row's file, row, episode
        del columns, rows
        recovered.keep_only(("episode_index",))
    plan = RepairPlan(inv, damages, kept, dropped, recovered, [], {})
    _tasks_and_totals(plan, tasks)
    _staged(plan)
    _info_and_stats(plan)
    return plan


def _count(value: object) -> int | None:
    """A count info.json holds (None when it holds no count: missing, not an integer)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return int(value) if ok else None


def _saved_from_stats(
    inv: Inventory,
    runs: _Lookup,
    lengths: Callable[[int], Any] | None,
    rows: _Lookup,
) -> int | None:
    """How many episodes the recorder saved, from stats.json when info.json does not say: it
    rewrites stats.json after info.json for every saved episode, so its ``count`` is the frames
    of the episodes saved (the first ``k`` whose lengths add up to it). None when it does not
    tell."""
    counts = [
        (inv.stats.get(name) or {}).get("count")
        for name in ("index", "frame_index", "episode_index")
        if inv.stats is not None
    ]
    count = next((c[0] for c in counts if isinstance(c, list) and len(c) == 1), None)
    if not isinstance(count, int) or isinstance(count, bool):
        return None
    total = 0
    for k, ep in enumerate(np.union1d(runs.keys, rows.keys).tolist()):
        if ep != k or total >= count:
            break
        df, r = runs[ep] if ep in runs else (None, 0)
        total += int(df.rows[r]) if df is not None else int((lengths or _zero)(rows[ep]) or 0)
        if total == count:
            return k + 1
    return 0 if count == 0 else None


def _zero(_: int) -> int:
    return 0


def _no_rows(episodes: list[int], no_file: str = "") -> str:
    """The damage of kept episodes whose metadata rows never reached the disk (``no_file``:
    that no episodes file exists, said first)."""
    runs: list[list[int]] = []
    for ep in episodes:
        if runs and ep == runs[-1][1] + 1:
            runs[-1][1] = ep
        else:
            runs.append([ep, ep])
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:8])
    more = f", ... {len(runs) - 8} more" if len(runs) > 8 else ""
    eps = f"{noun_for(len(episodes), 'episode')} {shown}{more}"
    if no_file:
        return f"{no_file}: the metadata rows of {eps} rebuilt from their rows"
    return (
        f"no metadata row for {eps} (the recorder buffers them and died before writing them): "
        "rebuilt from their rows"
    )


def episode_rows(inv: Inventory, df: DataFile, r: int, columns: list[str]) -> pa.Table:
    """The rows of run ``r`` of ``df`` (only ``columns``), from the row groups holding them."""
    return df.read_rows(inv.root, int(df.first_row[r]), int(df.rows[r]), columns)


def _episode_tasks(inv: Inventory, df: DataFile, r: int, tasks: list[str]) -> list[str]:
    """The tasks of an episode without a metadata row: its rows' task_index, in the tasks
    table (LeRobot stores ``list(set(tasks))``; for one task that is ``[task]``)."""
    values = episode_rows(inv, df, r, ["task_index"])["task_index"].to_numpy()
    out = []
    for t in dict.fromkeys(values.tolist()):
        if not 0 <= t < len(tasks):
            raise DatasetError(f"task_index {t} is not in meta/tasks.parquet", df.rel)
        out.append(tasks[t])
    return out


def _place_videos(e: Episode, row: dict | None, cursors: dict[str, _Cursor]) -> str:
    """Each camera's (chunk, file, from, to) of ``e``: the recovered row's when its mp4 holds
    the frames there, else the next frames of the camera's mp4s. Why not, when a camera lacks
    them ("" when every camera has them)."""
    first = ""
    for key, cur in cursors.items():  # every camera moves past the episode's frames it has
        if row is not None and not e.rebuilt:
            c, f = row[f"videos/{key}/chunk_index"], row[f"videos/{key}/file_index"]
            a, b = row[f"videos/{key}/from_timestamp"], row[f"videos/{key}/to_timestamp"]
            why = cur.place_recovered(c, f, a, b, e.length)
            if not why:
                e.videos[key] = (c, f, a, b)
        else:
            place, why = cur.place_next(e.length)
            if place is not None:
                e.videos[key] = place
        first = first or (f"camera {key}: {why}" if why else "")
    return first


def _tasks_and_totals(plan: RepairPlan, tasks: list[str]) -> None:
    """The output's tasks: the table's up to the last one a kept episode uses (a task only the
    dropped episode brought is not kept)."""
    used = {t for ts in task_lists(plan.kept) for t in ts}
    last = max((i for i, t in enumerate(tasks) if t in used), default=-1)
    plan.tasks = tasks[: last + 1]
    missing = sorted(used - set(plan.tasks))
    if missing:
        raise DatasetError(f"tasks {missing[:3]} are not in meta/tasks.parquet")
    inv = plan.inventory
    if inv.tasks_problem:
        plan.damages.append(("meta/tasks.parquet", f"unreadable ({inv.tasks_problem})"))
    elif len(plan.tasks) != len(tasks):
        extra = len(tasks) - len(plan.tasks)
        plan.damages.append(("meta/tasks.parquet", f"{extra} task(s) used by no kept episode"))


def _staged(plan: RepairPlan) -> None:
    inv = plan.inventory
    png = sum(n for cams in inv.staged_png.values() for n in cams.values())
    temp = sum(len(c) for c in inv.temp_videos.values())
    if png:
        eps = ", ".join(str(e) for e in sorted(inv.staged_png))
        plan.damages.append(("images", f"{png} staged PNG frames of unsaved episode(s) {eps}"))
        plan.staged["PNG files"] = png
    if temp:
        eps = ", ".join(str(e) for e in sorted(inv.temp_videos))
        plan.damages.append(("tmp*", f"{temp} episode mp4s never appended (episode(s) {eps})"))
        plan.staged["episode mp4s"] = temp
    for key, files in inv.videos.items():
        used = {e.videos[key][:2] for e in plan.kept}
        for v in files:
            if (v.chunk, v.file) not in used:
                plan.damages.append((v.rel, "holds no kept episode"))


def _info_and_stats(plan: RepairPlan) -> None:
    inv, info = plan.inventory, plan.inventory.info
    want = {
        "total_episodes": len(plan.kept),
        "total_frames": plan.frames,
        "total_tasks": len(plan.tasks),
    }
    if inv.info_on_disk is not None:  # (else its one damage says every key is rebuilt)
        for key, value in want.items():
            if info.get(key) != value:
                what = f"{key} is {info.get(key)}, the data has {value}"
                plan.damages.append(("meta/info.json", what))
        if info.get("splits") != {"train": f"0:{len(plan.kept)}"}:
            plan.damages.append(("meta/info.json", f"splits is {info.get('splits')}"))
    if inv.stats is None:
        plan.stats_reason = f"meta/stats.json is {inv.stats_problem}"
    else:
        for name in repair_schema.stats_features(info):
            count = (inv.stats.get(name) or {}).get("count")
            expect = plan.frames
            if info["features"][name].get("dtype") in ("image", "video"):
                continue  # image counts are sampled frames, not rows
            if count != [expect]:
                plan.stats_reason = f"{name}/count is {count}, the data has {expect} frames"
                break
    if plan.stats_reason:
        plan.damages.append(("meta/stats.json", plan.stats_reason))
