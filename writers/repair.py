"""``episodekit repair``: a recording killed before it finished comes back, every episode that
reached the disk bit for bit, as a root LeRobot loads again.

:func:`repair` inspects the root (:mod:`~episodekit.writers.repair_inspect`), decides
(:mod:`~episodekit.writers.repair_plan`), writes the changed files into a staging folder
(:mod:`~episodekit.writers.repair_build`), verifies the staged root (every data file decoded
whole, index and episodes as planned, the root opened as a dataset, every kept episode's
frames in its mp4s), then publishes it:

- ``--out DIR``: DIR follows the one output-folder rule
  (:func:`~episodekit.core.outdir.check_output_dir`, never ROOT, inside it or around it); the
  staged root (unchanged files copied) is swapped into DIR under DIR's writer lock
  (:mod:`episodekit.core.staging`: a killed run's staging folder is removed by the next run).
  ROOT is only read. A rerun on the same ROOT finds the key it recorded and does nothing.
- ``--in-place``: ROOT's writer lock is taken before ROOT is inspected (a second run waits,
  then finds nothing to repair); the new files are staged next to ROOT's real folder (as
  above) and verified; then a backup folder next to ROOT (``.ROOT.episodekit-backup-<token>``,
  marked as episodekit's) is made whole with its manifest (the files replaced, created and
  removed, each one's sha256 before and after), and in one step that SIGINT/SIGTERM cannot
  cut (:func:`episodekit.core.interrupt.deferred`) each file it replaces is kept there (a hard
  link, else a copy) and replaced atomically by the new one, and the files it removes (staged
  PNGs) are moved there. An interrupt ends the run with ROOT as it was (before that step) or
  fully repaired (during it, or after: the backup is named on stderr on every way out); an
  error during it puts ROOT back as it was. A ``kill -9`` during it leaves ROOT half repaired
  and the backup: the next run refuses until :func:`restore` has put it back.
- ``--restore``: :func:`restore` puts a backup back, only over files unchanged since the repair
  (the manifest's hashes), with every manifest path confined to ROOT.
- ``--dry-run``: the plan only.

A healthy root is "nothing to repair" (exit 0, nothing written); a root where no episode can
be recovered raises :class:`NothingRecoverable` (exit 1).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core import crashpoint, staging
from episodekit.core import parquet_salvage as ps
from episodekit.core import thrift_compact as tc
from episodekit.core.atomic import atomic_write_text
from episodekit.core.dataset import open_dataset
from episodekit.core.errors import DatasetError, EnvironmentProblem, os_problem
from episodekit.core.executor import imap_files
from episodekit.core.lock import remove_if_only_lock, writer_lock
from episodekit.core.outdir import check_output_dir, mark_output_dir
from episodekit.core.parquet_read import DataFile, open_data_file
from episodekit.core.progress import current
from episodekit.core.version import __version__
from episodekit.metadata.stats.range_counts import RangeCounts, counted
from episodekit.writers import repair_build
from episodekit.writers.recipe import local_identity
from episodekit.writers.repair_backup import (  # noqa: F401 - restore, undo_hint: the API
    MANIFEST,
    backup_note,
    commit,
    manifest_of,
    refuse_unfinished,
    restore,
    undo_hint,
)
from episodekit.writers.repair_inspect import inspect_root
from episodekit.writers.repair_kept import Kept, column
from episodekit.writers.repair_plan import RepairPlan, plan_repair

RECIPE = ".episodekit-repair.json"
FORMAT = 1
KEY_FORMAT = 2  # --out's rerun key; 2: files by identity (size, mtime, ctime, inode), version
READ_BATCH = 64 * 1024


class NothingRecoverable(DatasetError):
    """Not one episode of the root can be recovered."""


class RepairVerificationError(DatasetError):
    """The staged output disagrees with the plan: nothing was published."""


@dataclass(frozen=True)
class RepairOptions:
    out: str | None = None
    in_place: bool = False
    dry_run: bool = False
    keep_partial: bool = False
    executor: str = "local"


@dataclass
class RepairResult:
    """What a run found and did; ``status``: ``nothing to repair``, ``planned`` (dry run),
    ``repaired``, or ``unchanged`` (``--out`` already holds this repair)."""

    root: str
    status: str
    out: str | None = None
    damages: list[dict] = field(default_factory=list)
    episodes: int = 0
    frames: int = 0
    rebuilt: list[int] = field(default_factory=list)
    dropped: list[dict] = field(default_factory=list)
    left_behind: dict[str, int] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    backup: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def describe(plan: RepairPlan, root: str) -> RepairResult:
    """The plan as a result (what ``--dry-run`` reports)."""
    return RepairResult(
        root=root,
        status="planned",
        damages=[{"file": f, "damage": d} for f, d in plan.damages],
        episodes=len(plan.kept),
        frames=plan.frames,
        rebuilt=column(plan.kept, "index")[column(plan.kept, "meta_row") < 0].tolist(),
        dropped=[
            {"episode": d.episode, "frames": d.frames, "reason": d.reason} for d in plan.dropped
        ],
        left_behind=dict(plan.staged),
    )


def repair(root: str | os.PathLike, options: RepairOptions | None = None) -> RepairResult:
    """Repair ``root`` as ``options`` say (see the module docstring)."""
    options = options or RepairOptions()
    t0 = time.perf_counter()
    if options.out and options.in_place:
        raise ValueError("give --out DIR or --in-place, not both")
    if not (options.out or options.in_place or options.dry_run):
        raise ValueError("give --out DIR (a new folder), --in-place or --dry-run")
    out = None
    if options.out and not options.dry_run:  # the one rule: never ROOT, inside it or around it
        out = check_output_dir(options.out, sources=[root])
    local = "://" not in os.fspath(root) and os.path.isdir(root)
    if local:
        refuse_unfinished(root)
    locked = local and options.in_place and not options.dry_run
    box: list[RepairResult] = []
    try:
        # --in-place: ROOT's lock before the plan (a second run waits, then finds it repaired)
        with writer_lock(root) if locked else contextlib.nullcontext():
            if locked:
                staging.remove_stale(os.path.realpath(root))  # a killed run's folders
                refuse_unfinished(root)
            result = _run(root, options, out, box)
        result.seconds = time.perf_counter() - t0
        return result
    except BaseException:
        if box and box[0].backup:  # ROOT repaired, then the run stopped: name the way back
            print(backup_note(root, box[0].backup), file=sys.stderr, flush=True)
        raise


def _run(
    root: str | os.PathLike, options: RepairOptions, out: Path | None, box: list[RepairResult]
) -> RepairResult:
    """Inspect, plan and do what ``options`` say; the result goes into ``box`` at once (the
    caller names a backup even when this raises)."""
    say = current().step
    say(f"inspecting {root}")
    inv = inspect_root(root, options.executor)
    plan = plan_repair(inv, options.keep_partial)
    result = describe(plan, str(root))
    box.append(result)
    if plan.healthy:
        result.status = "nothing to repair"
    elif not plan.kept:
        why = "; ".join(f"{d['file']}: {d['damage']}" for d in result.damages[:3])
        raise NothingRecoverable(f"no episode can be recovered ({why})", str(root))
    elif options.dry_run:
        pass
    elif plan.needs_renumbering:
        if out is None:
            gone = [d.episode for d in plan.dropped][:5]
            raise EnvironmentProblem(
                f"episodes {gone} are dropped from the middle of the recording, so the output "
                "is renumbered: write it to a new folder with --out DIR",
                str(root),
            )
        result.out = str(out)
        with _nothing_published(out, f"nothing was published to {out}"):
            _renumbered(plan, out, result, options)
    elif out is not None:
        result.out = str(out)
        with _nothing_published(out, f"nothing was published to {out}"):
            _to_out(plan, out, result, options)
    else:
        root = plan.inventory.root
        with _nothing_published(root, f"{root} was not changed", staged_only=True):
            _in_place(plan, result, options)
    return result


@contextlib.contextmanager
def _nothing_published(dest: Path, said: str, staged_only: bool = False) -> Iterator[None]:
    """An environment error (a full disk, a read-only folder) while the repaired files are
    staged, told as one line about the file under ``dest`` it was going to be (the hidden
    staging folder is no name a user knows), ending with ``said`` (what was left as it was).
    ``staged_only``: only errors about a staged file (the in-place replacing has its own)."""
    try:
        yield
    except OSError as exc:
        problem = os_problem(exc, exc.filename or dest, "write")
        if not isinstance(problem, EnvironmentProblem):
            raise
        told = _told(problem, dest, said, staged_only)
        if told is None:
            raise
        raise told from exc
    except EnvironmentProblem as exc:
        told = _told(exc, dest, said, staged_only)
        if told is None:
            raise
        raise told from exc


def _told(exc: EnvironmentProblem, dest: Path, said: str, staged_only: bool):
    """``exc`` with every staging path of ``dest`` named as ``dest`` and ``said`` added (None:
    leave it as it is)."""
    name = re.escape(f".{dest.name}.episodekit-partial-")
    staged = re.compile(r"(?:[^\s:'\"]*/)?" + name + "[0-9a-f]{32}")
    text = str(exc)
    if not staged.search(text) and (staged_only or getattr(exc, "errno", None) is None):
        return None
    if staged_only and ".episodekit-backup-" in text:  # the replacing failed: its own words
        return None
    new = EnvironmentProblem(f"{staged.sub(lambda _: str(dest), text)} ({said})")
    new.errno = getattr(exc, "errno", None)  # type: ignore[attr-defined]
    return new


def source_key(plan: RepairPlan, options: RepairOptions) -> str:
    """What the output depends on: the tool version, the options and every file of ROOT, each
    by the identity edit's key gives a file (:func:`~episodekit.writers.recipe.local_identity`:
    size, mtime, ctime, inode; a rewrite that keeps size and mtime still changes the key)."""
    root = plan.inventory.root
    h = hashlib.sha256(b"episodekit-repair\0")
    files = [
        local_identity(p.relative_to(root).as_posix(), p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".episodekit")
    ]
    body = {"format": KEY_FORMAT, "version": __version__, "root": str(root.resolve())}
    body["files"] = files
    body["keep_partial"] = options.keep_partial
    h.update(json.dumps(body, sort_keys=True).encode())
    return h.hexdigest()[:32]


def _stage(
    plan: RepairPlan, staging: Path, options: RepairOptions, link: bool
) -> repair_build.Staged:
    """Build, bring in the unchanged files (hard links when ``link``), stats, verify."""
    say = current().step
    say(f"writing the repaired files of {len(plan.kept):,} episodes")
    staged, stats = repair_build.build(plan, staging)
    root = plan.inventory.root
    for rel in staged.unchanged:
        src, dst = root / rel, staging / rel
        if link:
            repair_build.link_or_copy(src, dst)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    say("verifying the repaired root")
    ranges = repair_build.value_ranges(plan, stats)
    counts = verify(plan, staging, options.executor, ranges, staged.salvaged)
    repair_build.build_stats(plan, staging, staged, stats, counts)
    _verify_videos(plan, staging)
    return staged


def _to_out(plan: RepairPlan, out: Path, result: RepairResult, options: RepairOptions) -> None:
    key = source_key(plan, options)
    created = not out.exists()
    try:
        with writer_lock(out):
            staging.remove_stale(out)  # a killed run's folders, even when up to date
            if _recorded_key(out) == key and (out / "meta/info.json").exists():
                result.status = "unchanged"
                return
            work = staging.new_staging(out)
            try:
                mark_output_dir(work, "episodekit repair")
                staged = _stage(plan, work, options, link=False)
                source = str(plan.inventory.root)
                recipe = {"key": key, "what": "episodekit repair", "source": source}
                atomic_write_text(work / RECIPE, json.dumps(recipe, indent=2))
                staging.publish(work, out)
            except BaseException:
                staging.discard(work, out)
                raise
    except BaseException:
        if created:
            remove_if_only_lock(out)
        raise
    result.status, result.files, result.removed = "repaired", staged.written, staged.removed


def _renumbered(plan: RepairPlan, out: Path, result: RepairResult, options: RepairOptions) -> None:
    """Episodes dropped from the middle: the kept ones are staged as they are (rows, rebuilt
    metadata), then written to ``out`` by the dataset writer, renumbered and verified against
    the staged rows (as ``edit --drop-episodes`` writes)."""
    from episodekit.writers.sources import source_episodes
    from episodekit.writers.writer import WriteOptions, write_dataset

    key = source_key(plan, options)
    if _recorded_key(out) == key:
        result.status = "unchanged"
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    staging.remove_stale(out)
    work = staging.new_staging(out)  # the kept episodes as they are: the writer's source
    try:
        staged, _ = repair_build.build(plan, work)
        for rel in staged.unchanged:
            if rel != repair_build.STATS:
                (work / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(plan.inventory.root / rel, work / rel)
        repair_build.contiguous_ranges(work)
        ds = open_dataset(str(work))
        what = WriteOptions(what="episodekit repair", executor=options.executor)
        written = write_dataset(source_episodes(ds), out, what)
        source = str(plan.inventory.root)
        recipe = {"key": key, "what": "episodekit repair", "source": source}
        atomic_write_text(out / RECIPE, json.dumps(recipe, indent=2))
    finally:
        staging.discard(work, out)
    result.status = "repaired"
    result.files = {
        "(every file)": f"renumbered: {written.episodes} episodes, {written.data_files} data "
        f"files, {written.video_files} video files, written and verified by the dataset writer"
    }


def _recorded_key(out: Path) -> str | None:
    try:
        return json.loads((out / RECIPE).read_text()).get("key")
    except (OSError, ValueError, AttributeError):
        return None


def _in_place(plan: RepairPlan, result: RepairResult, options: RepairOptions) -> None:
    """Stage and verify next to ROOT, then :func:`_commit` (the caller holds ROOT's lock)."""
    root = Path(os.path.realpath(plan.inventory.root))  # next to the real folder (a link's
    work = staging.new_staging(root)  # parent may be another filesystem), where restore looks
    try:
        staged = _stage(plan, work, options, link=True)
        crashpoint.reached("in-place: staged")
        commit(root, work, staged, manifest_of(root, work, staged), result)
        result.status, result.files, result.removed = "repaired", staged.written, staged.removed
    finally:
        staging.discard(work, root)


# --------------------------------------------------------------------------------------------
# Verification


def _verify_file(
    job: tuple[str, int, np.ndarray, np.ndarray, tuple | None], shared: tuple[str, dict | None]
) -> dict[str, RangeCounts] | None:
    """One output data file decoded whole: ``index`` consecutive from its first, its episodes
    (``episode_index`` runs) and their lengths as planned; with ``ranges`` (feature -> lo, hi
    per dimension), each feature's values counted over them from the same decoded rows (the
    first pass of the exact quantiles: :func:`verify`).

    A file staged by :func:`~episodekit.core.parquet_salvage.write_salvaged` (``salvaged``:
    its salvage and template) is read a window of row groups at a time under footers of their
    own (:mod:`episodekit.core.parquet_window`: pyarrow never holds a footer of its thousands
    of row groups), after its footer on disk is found to be, byte for byte, the one those
    row groups' structs make; any other file under its own footer."""
    staging, ranges = shared
    rel, first, episodes, lengths, salvaged = job
    path = os.path.join(staging, rel)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    counts = {n: RangeCounts.over(lo, hi) for n, (lo, hi) in (ranges or {}).items()}
    at = 0
    with contextlib.ExitStack() as stack:
        if salvaged is not None:
            cut, template = salvaged
            if not ps.footer_matches(path, cut, template):
                raise RepairVerificationError(f"{rel}: its footer is not the one planned")
            parts = _released(ps.windows(path, cut, template).tables(rows=READ_BATCH))
        else:
            pf = stack.enter_context(open_data_file(path, shared_footer=False))
            meta = pf.metadata
            rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            if meta.num_rows != sum(rows):
                raise RepairVerificationError(f"{rel}: its footer counts rows differently")
            parts = _row_group_batches(pf, rows)
        for batch in counted(parts, counts):
            n = batch.num_rows
            idx = batch.column("index").to_numpy()
            ep = batch.column("episode_index").to_numpy()
            if not np.array_equal(idx, np.arange(first + at, first + at + n)):
                raise RepairVerificationError(f"{rel}: index is not consecutive from {first}")
            planned = np.arange(at, min(at + n, total))  # the plan's episode of each row
            expect = episodes[np.searchsorted(ends, planned, side="right")]
            if not np.array_equal(ep, expect):
                raise RepairVerificationError(f"{rel}: episode_index differs from the plan")
            at += n
    if at != total:
        raise RepairVerificationError(f"{rel}: {at} rows, the plan has {total}")
    return counts if ranges is not None else None


def _released(parts):
    """``parts`` as they come; the decode buffers the pool keeps for the next read handed
    back to the system at the end (see :func:`_row_group_batches`)."""
    try:
        yield from parts
    finally:
        pa.default_memory_pool().release_unused()


def _row_group_batches(pf: DataFile, rows: list[int]):
    """Every column of every row group, whole groups of about ``READ_BATCH`` rows at a time
    (memory: about one such read, whatever the file; the decode buffers the pool keeps for the
    next read are handed back to the system at the end, not between reads: that cost 0.1 s
    on a 1M-frame file for 40 MB less peak)."""
    group: list[int] = []
    total = 0
    try:
        for i, n in enumerate(rows):
            group.append(i)
            total += n
            if total >= READ_BATCH or i == len(rows) - 1:
                yield pf.read_row_groups(group)
                group, total = [], 0
    finally:
        pa.default_memory_pool().release_unused()


def verify(
    plan: RepairPlan,
    staging: Path,
    executor: str = "local",
    ranges: dict | None = None,
    salvaged: dict[str, tuple[ps.Salvage, tc.Struct]] | None = None,
) -> dict[str, RangeCounts] | None:
    """Check the staged data against the plan (module docstring); raise
    :class:`RepairVerificationError` naming the first difference. With ``ranges`` (feature ->
    lo, hi per dimension), also return each feature's values counted over them
    (:class:`~episodekit.metadata.stats.range_counts.RangeCounts`), from the rows the check
    decodes: the exact quantiles' first pass costs no read of its own. ``salvaged``: the data
    files :func:`~episodekit.core.parquet_salvage.write_salvaged` staged (relative path ->
    salvage, template), read a window at a time (:func:`_verify_file`)."""
    try:
        ds = open_dataset(str(staging))
    except DatasetError as exc:
        raise RepairVerificationError(f"the repaired root does not open: {exc}") from exc
    lengths = column(plan.kept, "length")
    same = ds.num_episodes == len(plan.kept)
    if not same or not np.array_equal(np.asarray(ds.column("length")), lengths):
        raise RepairVerificationError("the repaired root's episodes differ from the plan")
    del ds
    index, first = column(plan.kept, "index"), column(plan.kept, "first_index")
    rels = [e.data.rel for e in plan.kept] if not isinstance(plan.kept, Kept) else None
    where = np.array([rels.index(r) for r in rels]) if rels is not None else plan.kept.files()
    jobs = []
    for f in dict.fromkeys(where.tolist()):  # each data file's episodes, in order
        mine = np.flatnonzero(where == f)
        rel = plan.kept[int(mine[0])].data.rel
        job = (rel, int(first[mine[0]]), index[mine], lengths[mine], (salvaged or {}).get(rel))
        jobs.append(job)
    workers = 1 if executor == "local" else None
    counts: dict[str, RangeCounts] | None = None
    for _, part in imap_files(_verify_file, jobs, executor, workers, shared=(str(staging), ranges)):
        if part is None:
            continue
        if counts is None:
            counts = part
        else:
            for name, rc in part.items():
                counts[name].merge(rc)
    return counts


def _verify_videos(plan: RepairPlan, staging: Path) -> None:
    if not plan.inventory.videos:
        return
    from episodekit.core.video import probe
    from episodekit.validate.video import episode_findings

    fps = float(plan.inventory.info["fps"])
    for key, files in plan.inventory.videos.items():
        for v in files:
            eps = [e for e in plan.kept if e.videos[key][:2] == (v.chunk, v.file)]
            if not eps:
                continue
            index = probe(staging / v.rel)
            found = episode_findings(
                index.seconds,
                np.array([e.index for e in eps]),
                np.array([e.videos[key][2] for e in eps]),
                np.array([e.videos[key][3] for e in eps]),
                np.array([e.length for e in eps]),
                fps,
                1e-4,
                v.rel,
            )
            errors = [f for f in found if f.severity == "error"]
            if errors:
                raise RepairVerificationError(f"{v.rel}: {errors[0].message}")
