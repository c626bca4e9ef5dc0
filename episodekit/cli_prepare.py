"""CLI: Run the whole preparation job. (placeholder until implemented)."""

import click


@click.command("prepare")
def prepare_command() -> None:
    """Run the whole preparation job. (not implemented yet)"""
    raise click.ClickException("not implemented yet")
