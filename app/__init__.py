"""episodekit: prepare LeRobot-format datasets for large-scale training and load them back."""

from episodekit.core.version import __version__

__all__ = ["__version__"]
