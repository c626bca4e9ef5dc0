"""``python -m episodekit.cli``: the same as the ``episodekit`` console script."""

from episodekit.cli import main

if __name__ == "__main__":  # importing the module (docs tools walk every module) runs nothing
    main(prog_name="episodekit")
