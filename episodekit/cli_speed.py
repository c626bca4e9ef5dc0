"""CLI: Per-task speed percentiles. (placeholder until implemented)."""

import click


@click.command("speed")
def speed_command() -> None:
    """Per-task speed percentiles. (not implemented yet)"""
    raise click.ClickException("not implemented yet")
