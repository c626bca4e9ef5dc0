"""CLI: Validate a dataset root and its artifacts. (placeholder until implemented)."""

import click


@click.command("validate")
def validate_command() -> None:
    """Validate a dataset root and its artifacts. (not implemented yet)"""
    raise click.ClickException("not implemented yet")
