"""CLI: ``episodekit metadata costs|plan|speed|stats ROOT``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

from episodekit.cli.common import (
    PLAN_SPLIT,
    EpisodekitGroup,
    IntList,
    canonical_bins_option,
    cost_option,
    dataloader_workers_option,
    deprecated_alias,
    exclude_options,
    executor_option,
    force_option,
    jobs_option,
    json_option,
    locality_option,
    no_wait_option,
    parse_canonical_bins,
    pick,
    root_argument,
    split_long_option,
    writing,
)
from episodekit.cli.mixture_args import check_mixture_args
from episodekit.core import jsonout
from episodekit.core.words import plural

if TYPE_CHECKING:
    from episodekit.exclusions import ExcludeOptions


@click.command("costs")
@root_argument()
@cost_option("--model")
@force_option
@no_wait_option
def costs_command(root: str, model: str, force: bool, no_wait: bool) -> None:
    """Write the episode cost table ROOT/meta/episode_costs.parquet.

    One row per episode: episode_index, task_index, length, num_cameras, action_dim, data_bytes
    (its share of its data file, from the parquet footer: no data is scanned), video_bytes (its
    share of its mp4s by duration) and cost under --model. The model and the episodes fingerprint
    are stored in the file metadata; a fresh table is left alone.
    """
    import numpy as np

    from episodekit.metadata.costs import COST_FILE, ensure_costs

    with writing(root, no_wait):
        table, changed = ensure_costs(root, model=model, force=force)
    cost = table["cost"].to_numpy()
    lo, mid, hi = np.percentile(cost, [0, 50, 100]) if len(cost) else (0.0, 0.0, 0.0)
    status = "written" if changed else "fresh, kept"
    click.echo(
        f"{root}/{COST_FILE}: {status}; {plural(table.num_rows, 'episode')}, model {model}, "
        f"cost min {lo:,.4g} median {mid:,.4g} max {hi:,.4g} (max/min {hi / max(lo, 1e-12):.1f}x)"
    )


@click.command("plan")
@root_argument(required=False)
@click.option(
    "--world-size",
    "world_sizes",
    type=IntList(),
    default=None,
    help="Comma-separated world sizes (ranks), one plan each, e.g. 8,16,64.",
)
@canonical_bins_option()
@dataloader_workers_option(default=4)
@cost_option()
@click.option(
    "--algo",
    type=click.Choice(["auto", "lpt", "kk"]),
    default="auto",
    show_default=True,
    help="lpt: largest first to least-loaded bin; kk: Karmarkar-Karp largest differencing; "
    "auto: both (KK up to 50k items), keep the better.",
)
@split_long_option("refuse those sizes (exit 2, no plan written).")
@click.option(
    "--seed", default=0, show_default=True, help="Which rank/worker gets which bin (labels only)."
)
@click.option(
    "--policy",
    type=click.Choice(["trim", "wrap"]),
    default="trim",
    show_default=True,
    help="Equal samples per bin: trim heavier bins to the lightest, or wrap lighter ones.",
)
@locality_option(default="rowgroup")
@exclude_options
@click.option(
    "--mixture",
    default=None,
    metavar="FILE|JSON",
    help="Plan a mixture of several roots instead of ROOT: a mixture.json file or the same "
    "JSON inline (sources with root and weight; see README, Mixtures). Needs --out.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder for the mixture plan (with --mixture): mixture.json + ws{W}_nw{K}.json.",
)
@force_option
@no_wait_option
@json_option
def plan_command(
    root: str | None,
    world_sizes: list[int],
    workers: int,
    cost: str,
    algo: str,
    split_long: str,
    seed: int,
    policy: str,
    locality: str,
    mixture: str | None,
    out: str | None,
    force: bool,
    no_wait: bool,
    as_json: bool,
    exclude: ExcludeOptions,
    canonical_bins: str | None = None,
) -> None:
    """Write balanced shard plans ROOT/meta/shard_plans/ws{W}_nw{K}.json, one per world size.

    With --mixture M --out DIR (no ROOT): one mixture plan per world size in DIR, drawing
    from several roots with exact per-source quotas per epoch.

    Every episode goes to exactly one (rank, worker) bin (b = rank * workers + worker), balanced
    by cost first across ranks, then across workers inside each rank. Every bin yields the same
    number of samples per epoch (samples_per_rank = samples_per_worker x workers), so no rank
    runs out early. Prints the balance (max / lower bound, lower bound = max(total / bins,
    largest item)) next to the naive contiguous and round-robin splits on the same costs.
    A plan that exists with the same fingerprint, costs and parameters is kept.
    With --canonical-bins, also ROOT/meta/shard_plans/canonical_c{C}.json (world size free).

    --exclude-episodes / --exclude-frames / --exclude-flagged leave frames out of the plans
    (the data stays): every rank still gets the same number of samples, drawn only from what is
    left, and each plan records what it excluded and why.
    """
    from episodekit.metadata.plans.build import ensure_plans, format_balance

    canonical = parse_canonical_bins(canonical_bins)
    t0 = time.perf_counter()
    if mixture is not None or root is None:
        if canonical is not False:
            raise click.UsageError(
                "--canonical-bins plans one ROOT; it does not combine with --mixture"
            )
        if exclude:
            raise click.UsageError(
                "--exclude-* options plan one ROOT; they do not combine with --mixture"
            )
        check_mixture_args(root, mixture, out, "the mixture plan")
        if not world_sizes:
            raise click.UsageError("--mixture needs --world-size (e.g. --world-size 8,64)")
        _mixture_plan(mixture, out, world_sizes, workers, cost, algo, split_long, seed, policy,
                      locality, force, no_wait, as_json)  # fmt: skip
        return
    if not world_sizes and canonical is False:
        raise click.UsageError("give --world-size, --canonical-bins, or both")
    if out is not None:
        raise click.UsageError("--out is for mixture plans (--mixture); ROOT's plans go to ROOT")
    split = PLAN_SPLIT[split_long]
    with writing(root, no_wait):
        if canonical is not False:  # before any plan is written
            from episodekit.metadata.plans.canonical import check_canonical_bins

            check_canonical_bins(root, canonical, split)
        from episodekit.core.dataset import open_dataset
        from episodekit.exclusions import build_exclusion
        from episodekit.metadata.plans.options import PlanOptions

        ds = open_dataset(root)
        exclusion = build_exclusion(ds, exclude)
        options = PlanOptions(cost, algo, split, seed, force, policy, locality, exclusion)
        results = ensure_plans(ds, world_sizes or [], workers, options)
        if canonical is not False:
            from episodekit.metadata.plans.canonical import ensure_canonical_plan

            results.append(ensure_canonical_plan(ds, canonical, options))
    skip = ("items", "bin_offsets", "bin_cost", "bin_frames")
    _echo_plans(results, skip, format_balance, "plan", t0, as_json)


def _echo_plans(results, skip, describe, label: str, t0: float, as_json: bool) -> None:
    """Print ``(path, plan, changed)`` results: their headers (``skip``: the bulky arrays) as
    JSON, or one written/kept line and ``describe(plan)`` each, then the count and time."""
    if as_json:
        heads = [
            {"path": p, "changed": c, **{k: v for k, v in plan.items() if k not in skip}}
            for p, plan, c in results
        ]
        click.echo(jsonout.dumps(heads, indent=2, sort_keys=True))
        return
    for path, plan, changed in results:
        click.echo(f"{path}: {'written' if changed else 'fresh, kept'}")
        click.echo(describe(plan))
    click.echo(f"{plural(len(results), label)} in {time.perf_counter() - t0:.1f}s")


def _mixture_plan(
    mixture, out, world_sizes, workers, cost, algo, split_long, seed, policy, locality, force,
    no_wait, as_json,
) -> None:  # fmt: skip
    """``metadata plan --mixture M --out DIR``."""
    from episodekit.metadata.mixture.plan import format_mixture_plan
    from episodekit.mixture import plan_mixture

    t0 = time.perf_counter()
    results = plan_mixture(
        mixture, out, world_sizes, workers, wait=not no_wait, say=_say, cost=cost, algo=algo,
        split_long=PLAN_SPLIT[split_long], seed=seed, force=force, policy=policy, locality=locality,
    )  # fmt: skip
    skip = ("items", "item_source", "bin_offsets", "bin_cost", "bin_frames", "bin_draws")
    _echo_plans(results, skip, format_mixture_plan, "mixture plan", t0, as_json)


def _say(message: str) -> None:
    click.echo(message, err=True)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def format_speed_table(report: dict) -> str:
    """Human-readable table of a ``speed_report`` result."""
    lines = [
        f"{report['file']}: {report['status']} (fingerprint {report['fingerprint']})",
        f"{'task':>5} {'episodes':>9} {'distinct':>9} {'p5':>9} {'p50':>9} {'p95':>9} "
        f"{'sparse':>6}  task string",
    ]
    for t in report["tasks"]:
        name = t["task"] if len(t["task"]) <= 48 else t["task"][:45] + "..."
        lines.append(
            f"{t['task_index']:>5} {t['episodes']:>9} {t['distinct_lengths']:>9} "
            f"{_fmt(t['p5']):>9} {_fmt(t['p50']):>9} {_fmt(t['p95']):>9} "
            f"{'yes' if t['sparse'] else 'no':>6}  {name}"
        )
    return "\n".join(lines)


@click.command("speed")
@root_argument()
@force_option
@deprecated_alias("--recompute", "--force", "recompute", is_flag=True)
@no_wait_option
@json_option
def speed_command(root: str, force: bool, recompute: bool, no_wait: bool, as_json: bool) -> None:
    """Compute per-task speed percentiles of ROOT into meta/speed_percentiles.jsonl.

    Each task gets ten boundaries (5th, 15th, ..., 95th percentile of its episode lengths in
    frames); an episode's speed bucket (0, 10, ..., 100) is its length's place among its own
    task's boundaries. Tasks with fewer than 10 distinct lengths are sparse (bucket 50).

    The file records the episodes fingerprint: it is rewritten (atomically) when absent or when
    the dataset's episodes changed, and left alone when fresh. ROOT is a local path or an fsspec
    URL; a read-only or remote root is computed but not written. Status is one of written, fresh,
    not written.
    """
    from episodekit.metadata.speed import speed_report

    with writing(root, no_wait):
        report = speed_report(root, force=pick(force, recompute))
    click.echo(jsonout.dumps(report, indent=2) if as_json else format_speed_table(report))


def format_stats_report(report: dict, stats: dict | None = None) -> str:
    """Human-readable summary of a ``stats_report`` result; the image/video features it records
    are listed too, with their shape, sampled frames, range and per-channel mean from ``stats``
    (``meta/stats.json`` as :func:`load_lerobot_stats` reads it; None: not shown)."""
    import numpy as np

    lines = [
        f"{report['file']}: {report['status']} ({plural(report['episodes'], 'episode')}, "
        f"{plural(report['frames'], 'frame')}, fingerprint {report['fingerprint']})",
        f"{'feature':<28} {'dims':>5} {'quantiles':>9} {'rank error':>11}",
    ]
    for name, f in report["features"].items():
        lines.append(f"{name:<28} {f['dims']:>5} {f['quantiles']:>9} {f['rank_error']:>11.2e}")
    images = (report.get("images") or {}).get("features") or {}
    if images:
        lines.append(f"{'image feature':<28} {'kind':>5} {'shape':>9} {'frames':>11}")
    for name, kind in images.items():
        s = (stats or {}).get(name)
        if s is None or "mean" not in s:
            lines.append(f"{name:<28} {kind:>5} {'-':>9} {'-':>11}  (not in {report['file']})")
            continue
        mean = np.asarray(s["mean"], dtype=float)
        count = int(np.asarray(s.get("count", [0])).ravel()[0])
        shape = ",".join(str(d) for d in mean.shape)
        lo = float(np.min(s["min"])) if "min" in s else float("nan")
        hi = float(np.max(s["max"])) if "max" in s else float("nan")
        lines.append(f"{name:<28} {kind:>5} {shape:>9} {count:>11,}")
        lines.append(
            f"{'':<4}range {lo:.4g} .. {hi:.4g}, mean per channel "
            + " ".join(f"{v:.4g}" for v in mean.ravel())
        )
    return "\n".join(lines)


@click.command("stats")
@root_argument(required=False)
@click.option(
    "--features",
    default=None,
    help="Comma-separated numeric features to compute (default: every numeric feature).",
)
@click.option(
    "--quantiles",
    type=click.Choice(["exact", "sketch"]),
    default="exact",
    show_default=True,
    help="exact: the exact order statistics (np.quantile's values) while the columns fit "
    "--memory-mb; sketch: from the mergeable rank summary (rank-error bound recorded). With "
    "--mixture, sketch (or exact beyond --memory-mb) reads no data of a source whose "
    "per-episode sketches are fresh (meta/episodekit_sketches.parquet).",
)
@click.option(
    "--memory-mb",
    type=click.FloatRange(min=1),
    default=4096.0,
    show_default=True,
    help="Budget for the sorted columns the exact selection keeps (memory-mapped temporary "
    "files); beyond it the quantiles come from the rank summary.",
)
@click.option(
    "--images",
    is_flag=True,
    help="Also compute image/video feature stats (LeRobot's frame sampling, per channel, "
    "(3,1,1), in [0,1]); needs PyAV for videos ('episodekit[video]'), Pillow for images in "
    "parquet ('episodekit[images]'). Without it existing image/video stats are kept.",
)
@click.option(
    "--mixture",
    default=None,
    metavar="FILE|JSON",
    help="Stats of a mixture instead of ROOT, weighted as sampled (each source by its "
    "per-epoch quota): a mixture.json file or the same JSON inline. Needs --out; not with "
    "--images, --executor, --jobs (one process).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder for the mixture stats (with --mixture; the mixture plan's folder): "
    "stats.json + stats_meta.json.",
)
@jobs_option
@executor_option
@force_option
@no_wait_option
@json_option
def stats_command(
    root: str | None,
    features: str | None,
    quantiles: str,
    memory_mb: float,
    images: bool,
    jobs: int | None,
    executor: str,
    force: bool,
    no_wait: bool,
    as_json: bool,
    mixture: str | None = None,
    out: str | None = None,
) -> None:
    """Compute normalization statistics of ROOT: meta/stats.json and the per-episode
    stats/{feature}/{key} columns of meta/episodes, in LeRobot v3.0's layout.

    For every numeric feature, per dimension: min, max, mean, std, count, q01, q10, q50, q90,
    q99. Per-episode values are exact; dataset mean/std come from a counts-weighted parallel
    merge, dataset quantiles from the data (exact mode) or a mergeable rank summary whose
    rank-error bound is recorded in meta/episodekit_stats.parquet. Image/video stats are kept
    as they are unless --images. Fresh stats (same episodes fingerprint and data files) are left
    alone.

    With --mixture M --out DIR (no ROOT): the mixture's stats in DIR/stats.json, each source
    weighted by the frames it draws per epoch (its filters honoured, features mapped as the
    loader maps them); a changed source makes them stale and the rerun names it.
    """
    from episodekit.metadata.stats import stats_report

    only = [f.strip() for f in features.split(",") if f.strip()] if features else None
    if mixture is not None or root is None:
        if images:
            raise click.UsageError(
                "--images is for ROOT's stats; it does not combine with --mixture"
            )
        for flag, given in (("--executor", executor != "local"), ("--jobs", jobs is not None)):
            if given:  # the mixture stats run in this process
                raise click.UsageError(
                    f"{flag} is for ROOT's stats; it does not combine with --mixture "
                    "(the mixture stats run in one process)"
                )
        _mixture_stats(root, mixture, out, only, quantiles, memory_mb, force, no_wait, as_json)
        return
    if out is not None:
        raise click.UsageError("--out is for mixture stats (--mixture); ROOT's stats go to ROOT")
    with writing(root, no_wait):
        report = stats_report(
            root,
            force=force,
            features=only,
            quantiles=quantiles,
            memory_mb=memory_mb,
            executor=executor,
            jobs=jobs,
            images=images,
        )
    if as_json:
        click.echo(jsonout.dumps(report, indent=2))
        return
    stats = None
    if (report.get("images") or {}).get("features") and report["status"] != "not written":
        from episodekit.metadata.stats import load_lerobot_stats

        stats = load_lerobot_stats(root)
    click.echo(format_stats_report(report, stats))


def _mixture_stats(
    root, mixture, out, only, quantiles, memory_mb, force, no_wait, as_json
) -> None:  # fmt: skip
    """``metadata stats --mixture M --out DIR``."""
    from episodekit.metadata.mixture.stats import format_mixture_stats
    from episodekit.mixture import stats_of_mixture

    check_mixture_args(root, mixture, out, "the mixture stats")
    report = stats_of_mixture(
        mixture, out, wait=not no_wait, say=_say, force=force, features=only,
        quantiles=quantiles, memory_mb=memory_mb,
    )  # fmt: skip
    click.echo(jsonout.dumps(report, indent=2) if as_json else format_mixture_stats(report))


@click.group("metadata", cls=EpisodekitGroup)
def metadata_group() -> None:
    """Derived tables under meta/: speed percentiles, episode costs, shard plans, stats."""


metadata_group.add_command(speed_command)
metadata_group.add_command(costs_command)
metadata_group.add_command(plan_command)
metadata_group.add_command(stats_command)
