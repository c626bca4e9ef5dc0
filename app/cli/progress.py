"""How progress looks on the command line (library code reports through core/progress.py).

- stderr is a terminal and no ``--quiet``: tqdm bars (files done / total, bytes and rate when
  the work reports them, ETA) under the current stage's name, and one line per step;
- stderr is not a terminal (CI logs, pipes) or ``--quiet``: the step lines only;
- ``--json``: nothing on stderr (stdout carries the JSON).

Any command gets this without code of its own: the root command installs it (cli/common.py).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any

import click

from episodekit.cli.meta import META_JSON, META_QUIET
from episodekit.core.progress import Progress, Task


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.0f} MiB"


class _BarTask(Task):
    """One tqdm bar: position in files, bytes and throughput in the postfix."""

    def __init__(self, label: str, total: int | None, unit: str):
        from tqdm import tqdm  # noqa: PLC0415 - only when a bar is shown

        self.t0 = time.perf_counter()
        self.nbytes = 0
        size = shutil.get_terminal_size((100, 20))  # a pty without a size gets 100 x 20
        self.bar = tqdm(
            total=total,
            desc=label,
            unit=f" {unit}s" if unit == "file" else unit,
            file=sys.stderr,
            leave=False,
            ncols=size.columns,
            nrows=max(size.lines, 2),
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}{unit} "
            "[{elapsed}<{remaining}{postfix}]"
            if total
            else None,
        )

    def advance(self, n: int = 1, nbytes: int = 0) -> None:
        if nbytes:
            self.nbytes += nbytes
            rate = self.nbytes / max(time.perf_counter() - self.t0, 1e-9)
            self.bar.set_postfix_str(f"{_mib(self.nbytes)}, {_mib(rate)}/s", refresh=False)
        if n:
            self.bar.update(n)
        elif nbytes:
            self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


class CliProgress(Progress):
    """The reporter the CLI installs; reads --quiet/--json from the click context's meta."""

    def __init__(self, meta: dict[str, Any]):
        self.meta = meta
        self.label = "working"
        self.tasks: list[Task] = []

    @property
    def silent(self) -> bool:
        return bool(self.meta.get(META_JSON))

    @property
    def bars(self) -> bool:
        return not self.silent and not self.meta.get(META_QUIET) and sys.stderr.isatty()

    def step(self, message: str) -> None:
        if not self.silent:
            click.echo(message, err=True)

    def stage(self, name: str) -> None:
        self.label = name

    def task(self, total: int | None, label: str | None = None, unit: str = "file") -> Task:
        task: Task = _BarTask(label or self.label, total, unit) if self.bars else Task()
        self.tasks.append(task)
        closer = task.close

        def close() -> None:
            closer()
            if task in self.tasks:
                self.tasks.remove(task)

        task.close = close  # type: ignore[method-assign]
        return task

    def active(self) -> Task:
        return self.tasks[-1] if self.tasks else Task()


def hub_bars_follow(ctx: click.Context) -> None:
    """huggingface_hub draws its own upload/download bars: only where ours would show too."""
    if not CliProgress(ctx.meta).bars:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
