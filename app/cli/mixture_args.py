"""The usage rules of a command run on a mixture (``--mixture M --out DIR``) instead of ROOT."""

from __future__ import annotations

import os

import click


def check_mixture_args(root: str | None, mixture: str | None, out: str | None, what: str) -> None:
    """The usage rules of a command run with ``--mixture M --out DIR`` instead of ROOT (``what``:
    what DIR receives, for the message)."""
    if root is not None:
        raise click.UsageError("give either ROOT or --mixture, not both")
    if mixture is None:
        raise click.UsageError("missing ROOT (or --mixture FILE with --out DIR)")
    if out is None:
        raise click.UsageError(f"--mixture needs --out DIR (the folder for {what})")
    if os.path.exists(os.path.join(out, "meta", "info.json")):  # before anything is written
        raise click.BadParameter(
            f"{out} is a dataset root (it has meta/info.json); give another folder for {what}",
            param_hint="--out",
        )
