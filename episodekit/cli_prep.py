"""CLI: Rewrite data parquet files (row groups, page index). (placeholder until implemented)."""

import click


@click.group("prep")
def prep_group() -> None:
    """Rewrite data parquet files (row groups, page index). (not implemented yet)"""
    raise click.ClickException("not implemented yet")
