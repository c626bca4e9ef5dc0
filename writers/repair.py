"""``episodekit repair``: a recording killed before it finished comes back, every episode that
reached the disk bit for bit, as a root LeRobot loads again.

:func:`repair` inspects the root (:mod:`~episodekit.writers.repair_inspect`), decides
(:mod:`~episodekit.writers.repair_plan`), writes the changed files into a staging folder
(:mod:`~episodekit.writers.repair_build`), verifies the staged root (every data file decoded
whole, index and episodes as planned, the root opened as a dataset, every kept episode's
frames in its mp4s), then publishes it:

- ``--out DIR``: the staged root (unchanged files copied) is swapped into DIR under DIR's
  writer lock; ROOT is only read. A rerun on the same ROOT finds the key it recorded and does
  nothing.
- ``--in-place``: each file it replaces is first kept in a backup folder next to ROOT
  (``ROOT.repair-backup-<time>``, with a manifest; a hard link, else a copy), then replaced
  atomically by the new one; files it removes (staged PNGs) are moved there; :func:`restore`
  puts the backup back. Nothing else in ROOT changes.
- ``--dry-run``: the plan only.

A healthy root is "nothing to repair" (exit 0, nothing written); a root where no episode can
be recovered raises :class:`NothingRecoverable` (exit 1).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodekit.core.atomic import atomic_write_text, fsync_dir
from episodekit.core.dataset import open_dataset
from episodekit.core.errors import DatasetError, EnvironmentProblem, os_problem
from episodekit.core.executor import imap_files
from episodekit.core.lock import LOCK_NAME, writer_lock
from episodekit.core.outdir import MARKER, check_output_dir, mark_output_dir
from episodekit.core.progress import current
from episodekit.writers import repair_build
from episodekit.writers.repair_inspect import inspect_root
from episodekit.writers.repair_plan import RepairPlan, plan_repair

RECIPE = ".episodekit-repair.json"
MANIFEST = "manifest.json"
FORMAT = 1
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
        rebuilt=[e.index for e in plan.kept if e.rebuilt],
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
    if options.out and not options.dry_run:
        out = check_output_dir(options.out)
        _check_outside(out, Path(root))
    say = current().step
    say(f"inspecting {root}")
    inv = inspect_root(root, options.executor)
    plan = plan_repair(inv, options.keep_partial)
    result = describe(plan, str(root))
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
        _renumbered(plan, out, result, options)
    elif out is not None:
        result.out = str(out)
        _to_out(plan, out, result, options)
    else:
        _in_place(plan, result, options)
    result.seconds = time.perf_counter() - t0
    return result


def _check_outside(out: Path, root: Path) -> None:
    a, b = out.resolve(), root.resolve()
    if a == b or b in a.parents or a in b.parents:
        raise EnvironmentProblem(
            "--out must be a new folder outside ROOT (or repair ROOT with --in-place)", str(out)
        )


def source_key(plan: RepairPlan, options: RepairOptions) -> str:
    """What the output depends on: every file of ROOT (path, size, mtime) and the options."""
    root = plan.inventory.root
    h = hashlib.sha256(b"episodekit-repair\0")
    files = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.name.startswith(".episodekit"):
            st = p.stat()
            files.append([p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns])
    body = {"format": FORMAT, "root": str(root.resolve()), "files": files}
    body["keep_partial"] = options.keep_partial
    h.update(json.dumps(body, sort_keys=True).encode())
    return h.hexdigest()[:32]


# Staging, publishing and clean-up of a failed first write: repair's own, small, as the dataset
# writer does them (``writers/writer.py``), so that module stays as it is here.


def _staging(next_to: Path) -> Path:
    """A new staging folder next to ``next_to`` (a random name), marked as episodekit's."""
    path = next_to.with_name(f"{next_to.name}.repair-partial-{uuid.uuid4().hex}")
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise os_problem(exc, path, "create folder") from exc
    mark_output_dir(path, "episodekit repair (staging; removed when the run ends)")
    return path


def _publish(staging: Path, out: Path) -> None:
    """Swap the verified staging folder into ``out`` (two renames: ``out`` is never partial),
    then remove the folder it replaced (``out`` is episodekit's: checked before)."""
    old = out.with_name(f"{out.name}.repair-old-{uuid.uuid4().hex}")
    try:
        if out.exists():
            os.rename(out, old)
        os.rename(staging, out)
    except OSError as exc:
        raise os_problem(exc, out, "publish") from exc
    fsync_dir(out.parent)
    shutil.rmtree(old, ignore_errors=True)


def _remove_if_only_lock(out: Path) -> None:
    """A failed first write leaves no folder behind (only its own lock file was in it)."""
    with contextlib.suppress(OSError):
        if out.is_dir() and set(os.listdir(out)) <= {LOCK_NAME}:
            shutil.rmtree(out)


def _stage(
    plan: RepairPlan, staging: Path, options: RepairOptions, link: bool
) -> repair_build.Staged:
    """Build, bring in the unchanged files (hard links when ``link``), stats, verify."""
    say = current().step
    say(f"writing the repaired files of {len(plan.kept):,} episodes")
    staged, episodes = repair_build.build(plan, staging)
    root = plan.inventory.root
    for rel in staged.unchanged:
        src, dst = root / rel, staging / rel
        if link:
            repair_build.link_or_copy(src, dst)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    repair_build.build_stats(plan, staging, staged, episodes)
    say("verifying the repaired root")
    verify(plan, staging, options.executor)
    return staged


def _to_out(plan: RepairPlan, out: Path, result: RepairResult, options: RepairOptions) -> None:
    key = source_key(plan, options)
    created = not out.exists()
    try:
        with writer_lock(out):
            if _recorded_key(out) == key and (out / "meta/info.json").exists():
                result.status = "unchanged"
                return
            staging = _staging(out)
            try:
                staged = _stage(plan, staging, options, link=False)
                source = str(plan.inventory.root)
                recipe = {"key": key, "what": "episodekit repair", "source": source}
                atomic_write_text(staging / RECIPE, json.dumps(recipe, indent=2))
                _publish(staging, out)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    except BaseException:
        if created:
            _remove_if_only_lock(out)
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
    staging = _staging(out)
    try:
        staged, _ = repair_build.build(plan, staging)
        for rel in staged.unchanged:
            if rel != repair_build.STATS:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(plan.inventory.root / rel, staging / rel)
        repair_build.contiguous_ranges(staging)
        ds = open_dataset(str(staging))
        what = WriteOptions(what="episodekit repair", executor=options.executor)
        written = write_dataset(source_episodes(ds), out, what)
        source = str(plan.inventory.root)
        recipe = {"key": key, "what": "episodekit repair", "source": source}
        atomic_write_text(out / RECIPE, json.dumps(recipe, indent=2))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
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
    root = plan.inventory.root
    lock_existed = (root / LOCK_NAME).exists()
    with writer_lock(root):
        staging = _staging(root)
        try:
            staged = _stage(plan, staging, options, link=True)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            backup = root.with_name(f"{root.name}.repair-backup-{stamp}-{uuid.uuid4().hex[:6]}")
            replaced = [rel for rel in staged.written if (root / rel).exists()]
            manifest = {
                "format": FORMAT,
                "root": str(root.resolve()),
                "replaced": replaced,
                "created": [rel for rel in staged.written if rel not in replaced]
                + ([] if lock_existed else [LOCK_NAME]),
                "removed": staged.removed,
            }
            mark_output_dir(backup, "episodekit repair --in-place (the files it replaced)")
            atomic_write_text(backup / MANIFEST, json.dumps(manifest, indent=2))
            for rel in replaced:  # kept in the backup first (a link), then replaced atomically
                repair_build.link_or_copy(root / rel, backup / "files" / rel)
            for rel in staged.written:
                _move(staging / rel, root / rel)
            for rel in staged.removed:
                _move(root / rel, backup / "files" / rel)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    result.status, result.files, result.removed = "repaired", staged.written, staged.removed
    result.backup = str(backup)


def _move(src: Path, dst: Path) -> None:
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
    except OSError as exc:
        raise os_problem(exc, src, "move") from exc


def restore(backup: str | os.PathLike, expect_root: str | os.PathLike | None = None) -> str:
    """Put an ``--in-place`` repair's backup back: the root is again what it was before it
    (files it created removed, files it replaced or removed moved back); the backup folder is
    removed. ``expect_root``: refuse a backup of another root. Returns the root."""
    backup = Path(backup)
    try:
        manifest = json.loads((backup / MANIFEST).read_text())
        root = Path(manifest["root"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EnvironmentProblem(f"not a repair backup ({exc})", str(backup)) from exc
    if expect_root is not None and Path(expect_root).resolve() != root.resolve():
        raise EnvironmentProblem(f"a backup of {root}, not of {expect_root}", str(backup))
    for rel in manifest["created"]:
        if rel != LOCK_NAME:
            (root / rel).unlink(missing_ok=True)
    for rel in [*manifest["replaced"], *manifest["removed"]]:
        _move(backup / "files" / rel, root / rel)
    if LOCK_NAME in manifest["created"]:
        (root / LOCK_NAME).unlink(missing_ok=True)
    (backup / MANIFEST).unlink()
    (backup / MARKER).unlink(missing_ok=True)
    shutil.rmtree(backup)
    return str(root)


# --------------------------------------------------------------------------------------------
# Verification


def _verify_file(job: tuple[str, int, list[int], list[int]], staging: str) -> None:
    """One output data file decoded whole: ``index`` consecutive from its first, its episodes
    (``episode_index`` runs) and their lengths as planned."""
    rel, first, episodes, lengths = job
    expect = np.repeat(np.asarray(episodes, np.int64), lengths)
    at = 0
    with pq.ParquetFile(os.path.join(staging, rel)) as pf:
        meta = pf.metadata
        rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        if meta.num_rows != sum(rows):
            raise RepairVerificationError(f"{rel}: its footer counts rows differently")
        for batch in _row_group_batches(pf, rows):
            n = batch.num_rows
            idx = batch.column("index").to_numpy()
            ep = batch.column("episode_index").to_numpy()
            if not np.array_equal(idx, np.arange(first + at, first + at + n)):
                raise RepairVerificationError(f"{rel}: index is not consecutive from {first}")
            if not np.array_equal(ep, expect[at : at + n]):
                raise RepairVerificationError(f"{rel}: episode_index differs from the plan")
            at += n
    if at != len(expect):
        raise RepairVerificationError(f"{rel}: {at} rows, the plan has {len(expect)}")


def _row_group_batches(pf: pq.ParquetFile, rows: list[int]):
    """Every column of every row group, whole groups of about ``READ_BATCH`` rows at a time
    (memory: one such read; freed decode buffers handed back to the system between reads)."""
    group: list[int] = []
    total = 0
    for i, n in enumerate(rows):
        group.append(i)
        total += n
        if total >= READ_BATCH or i == len(rows) - 1:
            yield pf.read_row_groups(group)
            pa.default_memory_pool().release_unused()
            group, total = [], 0


def verify(plan: RepairPlan, staging: Path, executor: str = "local") -> None:
    """Check the staged root against the plan (module docstring); raise
    :class:`RepairVerificationError` naming the first difference."""
    try:
        ds = open_dataset(str(staging))
    except DatasetError as exc:
        raise RepairVerificationError(f"the repaired root does not open: {exc}") from exc
    lengths = [e.length for e in plan.kept]
    if ds.num_episodes != len(plan.kept) or ds.column("length").tolist() != lengths:
        raise RepairVerificationError("the repaired root's episodes differ from the plan")
    jobs: dict[str, tuple[str, int, list[int], list[int]]] = {}
    for e in plan.kept:
        rel, f, eps, ns = jobs.get(e.data.rel, (e.data.rel, e.first_index, [], []))
        jobs[rel] = (rel, f, [*eps, e.index], [*ns, e.length])
    workers = 1 if executor == "local" else None
    for _ in imap_files(_verify_file, list(jobs.values()), executor, workers, shared=str(staging)):
        pass
    _verify_videos(plan, staging)


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
