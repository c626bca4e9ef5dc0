"""``python -m episodekit.cli``: the same as the ``episodekit`` console script."""

from episodekit.cli import main

main(prog_name="episodekit")
