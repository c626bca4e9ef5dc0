"""CLI: Episode cost table. (placeholder until implemented)."""

import click


@click.command("costs")
def costs_command() -> None:
    """Episode cost table. (not implemented yet)"""
    raise click.ClickException("not implemented yet")


@click.command("plan")
def plan_command() -> None:
    """Balanced shard plans (not implemented yet)"""
    raise click.ClickException("not implemented yet")
