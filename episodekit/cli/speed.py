"""CLI: ``episodekit metadata speed ROOT``: per-task speed percentiles, persisted once per root."""

from __future__ import annotations

import json

import click

from episodekit.cli.common import fail_cleanly


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
@click.argument("root")
@click.option(
    "--recompute", is_flag=True, help="Recompute and rewrite even when the file is fresh."
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def speed_command(root: str, recompute: bool, as_json: bool) -> None:
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

    with fail_cleanly():
        report = speed_report(root, recompute=recompute)
    click.echo(json.dumps(report, indent=2) if as_json else format_speed_table(report))
