"""``episodekit prepare``: from "as recorded" to "ready for a many-GPU run", then prove it.

Steps, in order, each skipped when its output is already fresh:

1. row-group rewrite (``episodekit.prep``): files marked with this target, or already in the band,
   are skipped after reading their footers only;
2. speed percentiles (fingerprint in the file);
3. episode cost table (fingerprint + model in the file metadata);
4. shard plans, one per world size (fingerprint + parameters + costs digest);
5. normalization stats (fingerprint + data files' size + footers in meta/episodekit_stats.parquet);
6. validation; a passing validation leaves a stamp (``meta/episodekit_validation.json``) keyed on
   the fingerprint and the size/mtime of every data file and artifact, so an unchanged root is not
   scanned again;
7. with ``frames``: the decoded frame store for random access (``episodekit prep frames``), in
   the local cache, never in the root (so nothing of it is pushed); skipped when fresh.

Nothing is written before the arguments and the plans' feasibility are checked: a world size
whose ``world_size x num_workers`` bins cannot all get a frame is skipped with a warning (or, with
``split_long="auto"``, planned with episodes cut into frame ranges), so the defaults work on any
valid dataset. A step that finds its output fresh is reported as "skipped" and nothing else; a
rerun where everything is fresh reads footers and artifact headers only and starts no process.

A remote root (``hf://datasets/owner/name[@rev]``, any fsspec URL) is read remotely and prepared
into ``out``; ``push_to_hub`` then uploads the files that changed in one commit.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from episodekit.core import interrupt
from episodekit.core.paths import STAMP_FILE
from episodekit.core.progress import current
from episodekit.core.words import plural
from episodekit.prepare_model import (
    SPLIT_LONG,
    STAMP_VERSION,
    STATS_MODES,
    PlanShape,
    PrepareOptions,
    PrepareResult,
    Step,
    read_stamp,
    state_digest,
)

if TYPE_CHECKING:
    from episodekit.core.dataset import Dataset

__all__ = [
    "SPLIT_LONG",
    "STAMP_FILE",
    "STAMP_VERSION",
    "STATS_MODES",
    "PlanShape",
    "PrepareOptions",
    "PrepareResult",
    "Step",
    "format_result",
    "plan_shapes",
    "prepare",
    "read_stamp",
    "run_prepare",
    "state_digest",
]


def plan_shapes(
    ds: Dataset, world_sizes: Sequence[int], num_workers: int, split_long: str
) -> list[PlanShape]:
    """Which world sizes can be planned (every bin must get a frame), decided before anything
    is written, from counts: whole episodes can fill ``bins`` bins when at least ``bins`` of
    them have frames (LPT gives each bin one first); cut episodes can when there are ``bins``
    frames. ``split_long`` ("auto", "yes", "no") as the run takes it; a shape's
    ``split_long`` says whether its plan must cut episodes. (The plans step leaves the choice
    to the plan writer, which keeps a fresh plan of either kind under "auto" and cuts episodes
    where a ``rowgroup`` partition of whole ones still leaves a bin empty.)"""
    n = int((ds.column("length") > 0).sum())
    frames, k = ds.num_frames, int(num_workers)
    out = []
    for w in world_sizes:
        w, bins = int(w), int(w) * k
        what = f"{plural(bins, 'bin')} ({plural(w, 'rank')} x {plural(k, 'worker')})"
        if frames < bins:
            out.append(PlanShape(w, skip=f"{plural(frames, 'frame')} cannot fill {what}"))
            continue
        tries = {"no": [False], "yes": [True], "auto": [False, True]}[split_long]
        possible = [t for t in tries if t or n >= bins]
        if not possible:
            hint = (
                "use --split-long auto to cut episodes into frame ranges, or"
                if split_long == "no"
                else "use"
            )
            out.append(
                PlanShape(
                    w,
                    skip=f"{plural(n, 'episode')} cannot give each of {what} a frame; "
                    f"{hint} a smaller --world-size or --workers",
                )
            )
        else:
            out.append(PlanShape(w, split_long=possible[0]))
    return out


def prepare(root: str, out: str | None = None, **options: Any) -> PrepareResult:
    """Run the whole job on ``root`` (or into ``out``); see the module docstring.

    ``options`` are :class:`PrepareOptions`' fields. ``jobs``: processes for the per-file steps
    (default: cores). ``hub_api``: an object with huggingface_hub's ``create_commit`` (tests
    pass a fake). ``split_long``: "auto" (cut episodes into frame ranges only where whole ones
    cannot fill the bins; the plans step says where), "yes" (always cut long episodes), "no"
    (skip such a world size); skipped world sizes are in ``result.warnings``, and a run where
    every world size is skipped fails at the plans step (no verdict without plans).
    ``progress``: an extra callback for the step lines (the current
    :mod:`episodekit.core.progress` reporter gets them too). Raises ``ValueError`` for bad
    arguments, ``EnvironmentProblem`` for a missing optional dependency and ``DatasetError`` for
    an unreadable root, all before writing anything; a failed validation is reported in the
    result (``ok`` False), not raised. ``locality``: the shard plans' (``rowgroup`` by default:
    each bin a contiguous run of row groups; ``none``: LPT/KK). ``videos_gop``: also re-encode
    the videos for random access with this GOP (``prep videos``, after the row groups).
    ``frames``: also build the frame store. ``canonical_bins``: also write the canonical plan for
    elastic resume (an int C, None for the default C of the episode count, False for none).
    ``stats``: "keep" the dataset's own stats when they pass the ``stats.*`` checks (computed
    where missing, stale or failing), "recompute" to replace them. The whole run holds the
    writer lock of the folder it writes (``wait=False``: EnvironmentProblem when another writer
    holds it; leftover temporaries there are removed under it).
    """
    return run_prepare(str(root), PrepareOptions(out=out, **options))


def run_prepare(root: str, opts: PrepareOptions) -> PrepareResult:
    """:func:`prepare` with its options as one object."""
    from episodekit.core.lock import writer_lock
    from episodekit.prepare_noop import eligible, noop_result
    from episodekit.prepare_steps import STEPS

    reporter = current()

    def say(msg: str) -> None:
        reporter.step(msg)
        if opts.progress is not None:
            opts.progress(msg)

    opts.check_values()
    root, opts = _convert_first(root, opts, say)
    if eligible(root, opts):  # a rerun where every step is fresh: from the stamp alone
        with writer_lock(root, wait=opts.wait, say=say):
            noop = noop_result(root, opts, say, STEPS)
        if noop is not None:
            return noop
    opts.check(root)  # nothing is written before the options and the plans' feasibility pass
    if opts.out is not None:  # refused before the lock file is written into it
        from episodekit.core.outdir import check_output_dir

        # symlinks resolved; never a user's folder, the source, inside it or around it
        final = check_output_dir(opts.out, sources=[root])
        return _run_staged(root, opts, final, say)
    with writer_lock(root, wait=opts.wait, say=say):
        return _run_locked(root, opts, say)


def _renamed(obj, old: str, new: str):
    """``obj`` (a step's JSON-able detail) with the path ``old`` replaced by ``new`` in strings."""
    if isinstance(obj, str):
        return obj.replace(old, new)
    if isinstance(obj, dict):
        return {k: _renamed(v, old, new) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_renamed(v, old, new) for v in obj]
    return obj


def _run_staged(root: str, opts: PrepareOptions, final: Path, say: Callable[[str], None]):
    """``--out``: the whole run works in a hidden staging folder next to ``final`` (seeded with
    hard links of an earlier run's files there, so fresh steps stay fresh), published at once
    when no step failed (a failed validation is a verdict: published); otherwise, and on any
    error, nothing is published and ``final`` stays as it was (:mod:`episodekit.core.staging`)."""
    from dataclasses import replace

    from episodekit.core import staging
    from episodekit.core.errors import EnvironmentProblem
    from episodekit.core.lock import LOCK_NAME, writer_lock
    from episodekit.prepare_steps import verdict_steps

    created = not final.exists()
    try:
        with writer_lock(final, wait=opts.wait, say=say):
            staging.remove_stale(final)
            work = staging.new_staging(final)
            try:
                staging.seed_from(final, work)

                def publish(ctx) -> None:
                    for step in ctx.result.steps:  # the report names DIR, never the staging
                        step.detail = _renamed(step.detail, str(work), str(final))
                    failed = [s.name for s in ctx.result.steps if s.status == "failed"]
                    # a verdict step's failure is a verdict on a complete output: published
                    if [n for n in failed if n not in verdict_steps()]:
                        staging.discard(work, final)
                        ctx.result.warnings.append(f"nothing was published to {final}")
                        return
                    staging.publish(work, final)
                    ctx.work = final
                    ctx.result.work_root = str(final)

                return _run_locked(root, replace(opts, out=str(work)), say, publish)
            except EnvironmentProblem as exc:
                staging.discard(work, final)
                text = str(exc).replace(str(work), str(final))
                problem = EnvironmentProblem(f"{text} (nothing was published)")
                problem.errno = getattr(exc, "errno", None)  # type: ignore[attr-defined]
                raise problem from exc
            except BaseException:
                staging.discard(work, final)
                raise
    except BaseException:
        if created and final.is_dir() and set(os.listdir(final)) <= {LOCK_NAME}:
            with contextlib.suppress(OSError):
                os.remove(final / LOCK_NAME)
                final.rmdir()
        raise


def _version_of(root: str) -> str | None:
    """The root's ``codebase_version`` (None when info.json cannot be read: the run reports it)."""
    import json
    from pathlib import Path

    try:
        if "://" in root:  # remote: through fsspec (a local root stays free of pyarrow here)
            from episodekit.core.dataset import read_info

            return str(read_info(root).get("codebase_version"))
        return str(json.loads((Path(root) / "meta/info.json").read_text()).get("codebase_version"))
    except Exception:  # an unreadable root fails later, with the usual message and exit code
        interrupt.check()  # Ctrl-C that a library turned into an error
        return None


def _convert_first(
    root: str, opts: PrepareOptions, say: Callable[[str], None]
) -> tuple[str, PrepareOptions]:
    """A v2.x root: refused (LeRobot reads only v3.0), or with ``convert`` converted into
    ``out`` (:func:`episodekit.writers.convert.convert`), which is then prepared in place."""
    from dataclasses import replace

    version = _version_of(root)
    if version not in ("v2.0", "v2.1"):  # core.dataset.V2, without importing pyarrow here
        return root, opts
    if not opts.convert:
        raise ValueError(
            f"{root} is a {version} dataset; LeRobot reads v3.0 only: convert it first "
            f"(`episodekit convert {root} --out DIR`, or prepare with --convert --out DIR)"
        )
    if opts.out is None:
        raise ValueError("--convert writes a new v3.0 dataset: give --out DIR")
    from episodekit.writers.convert import ConvertOptions, convert

    say(f"converting {root} ({version}) to v3.0 in {opts.out}")
    done = convert(root, opts.out, ConvertOptions(target_mb=opts.target_mb))
    say(f"convert: {done.status}; {plural(done.episodes, 'episode')}, stats {done.stats}")
    return str(opts.out), replace(opts, out=None, convert=False)


def _run_locked(
    root: str,
    opts: PrepareOptions,
    say: Callable[[str], None],
    publish: Callable[[Any], None] | None = None,
) -> PrepareResult:
    """The steps of :func:`prepare`, under the writer lock (options already checked);
    ``publish(ctx)`` puts a staged ``--out`` in place before anything is pushed."""
    from episodekit.core.dataset import open_dataset
    from episodekit.prepare_steps import Context, run_steps

    t0 = time.perf_counter()
    result = PrepareResult(root=str(root), work_root=str(opts.out or root))
    source = open_dataset(str(root))
    shapes = plan_shapes(source, opts.world_sizes, opts.num_workers, str(opts.split_long))
    for shape in shapes:
        if shape.skip:
            result.warnings.append(f"world size {shape.world_size} skipped: {shape.skip}")
    for w in result.warnings:
        say(f"warning: {w}")
    ctx = Context(root, opts, say, result, source, shapes)
    run_steps(ctx)
    if publish is not None:
        publish(ctx)
    _push(ctx, say)
    result.seconds = time.perf_counter() - t0
    return result


def _push(ctx, say: Callable[[str], None]) -> None:
    """Upload the changed files in one commit (``push_to_hub``), after a passing validation;
    with ``--out``, every file of the copy (a rerun after a failed push still uploads it all:
    the hub keeps what it has already)."""
    result, opts = ctx.result, ctx.opts
    if not (opts.push_to_hub and result.ok):
        return
    from episodekit.core.hub import parse_hub_root, push_files

    hub = parse_hub_root(opts.push_to_hub)
    repo = hub.repo_id if hub else opts.push_to_hub
    files = result.changed
    if opts.out is not None:
        work = ctx.work
        files = sorted(
            str(p.relative_to(work))
            for p in work.rglob("*")
            if p.is_file() and not p.name.startswith(".") and str(p.relative_to(work)) != STAMP_FILE
        )
    current().stage("push")
    say(f"push: uploading {plural(len(files), 'file')} to {repo}")
    result.pushed = push_files(
        ctx.work, files, repo, api=opts.hub_api, revision=hub.revision if hub else None
    )


def format_result(r: PrepareResult) -> str:
    """The one summary printed at the end of ``episodekit prepare``."""
    lines = [f"prepared {r.root}" + (f" -> {r.work_root}" if r.work_root != r.root else "")]
    lines.append(f"  {'step':<10} {'status':<8} {'seconds':>8}  what")
    for s in r.steps:
        lines.append(f"  {s.name:<10} {s.status:<8} {s.seconds:>8.2f}  {_what(s)}".rstrip())
    plans = (r.step("plans") or Step("plans", "", 0)).detail.get("plans", [])
    if plans:
        lines.append("  balance (max bin cost / lower bound; naive contiguous, round-robin)")
        for p in plans:
            b = p.get("balance") or {}
            shape = (
                f"ws={p['world_size']:<5} workers={p['num_workers']:<3}"
                if "world_size" in p
                else f"canonical C={p['canonical_bins']:<6}"
            )
            lines.append(
                f"    {shape} "
                f"plan {_ratio(b, 'plan')}  contiguous {_ratio(b, 'contiguous')}  "
                f"round-robin {_ratio(b, 'round_robin')}  samples/rank {p['samples_per_rank']}"
            )
    for w in r.warnings:
        lines.append(f"  warning: {w}")
    v = r.step("validate")
    failed = next((s for s in r.steps if s.status == "failed"), None)
    if failed is not None and failed.name != "validate":
        lines.append(f"prepare FAILED at step {failed.name} (validation did not run)")
    else:
        verdict = "PASSED" if r.ok else "FAILED"
        what = _what(v) if v else ""
        if v and v.status == "skipped":
            what = "unchanged since the last passing validation"
        lines.append(f"validation {verdict}" + (f" ({what})" if what else ""))
    lines.append(f"{plural(len(r.changed), 'file')} changed in {r.seconds:.1f}s")
    if r.pushed is not None:
        lines.append(f"pushed: {r.pushed}")
    return "\n".join(lines)


def _ratio(balance: dict, key: str) -> str:
    part = balance.get(key)
    if isinstance(part, dict) and "max_over_lower_bound" in part:
        return f"{part['max_over_lower_bound']:.4f}"
    if key == "plan" and "max_over_lower_bound" in balance:
        return f"{balance['max_over_lower_bound']:.4f}"
    return "?"


def _what(s: Step) -> str:
    """What a step did; nothing for a skipped step (its status says it all)."""
    from episodekit.prepare_steps import summarize

    return summarize(s)
