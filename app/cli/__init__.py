"""The ``episodekit`` command line: a thin shell, each command calls one library function."""

# ruff: noqa: E402 - signals are taken over before the imports, which can take a second

from __future__ import annotations

from episodekit.core import interrupt

interrupt.take_over()  # first: a Ctrl-C during the imports below exits 130, not a traceback

import click

from episodekit import __version__
from episodekit.cli.common import EpisodekitGroup, debug_option
from episodekit.cli.convert import convert_command
from episodekit.cli.dataset import info_command, sample_command
from episodekit.cli.import_ import import_command
from episodekit.cli.metadata import metadata_group
from episodekit.cli.prep import prep_group
from episodekit.cli.prepare import prepare_command
from episodekit.cli.repair import repair_command
from episodekit.cli.surgery import edit_command, merge_command, split_command
from episodekit.cli.validate import validate_command


@click.group(cls=EpisodekitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="episodekit")
@debug_option
def main() -> None:
    """Prepare LeRobot-format datasets for large-scale training, and check them.

    Typical use: `episodekit prepare ROOT` (rewrite row groups, compute speed percentiles, cost
    tables and shard plans, validate). Each step also has its own command.

    Exit codes: 0 success; 1 the data is at fault (a failed check, an unreadable info.json or
    data file); 2 the command cannot run as asked (bad option, missing root or mixture source,
    an output folder holding other files, read-only or full disk, unreachable hub, missing
    optional dependency); 130 interrupted (Ctrl-C); 143 terminated (SIGTERM). Interrupted
    or terminated, a command removes its temporaries and stops its worker processes; nothing
    half-written is left under a final name.
    """


main.add_command(info_command)
main.add_command(sample_command)
main.add_command(metadata_group)
main.add_command(prep_group)
main.add_command(validate_command)
main.add_command(prepare_command)
main.add_command(edit_command)
main.add_command(split_command)
main.add_command(merge_command)
main.add_command(convert_command)
main.add_command(repair_command)
main.add_command(import_command)


if __name__ == "__main__":  # pragma: no cover
    main()
