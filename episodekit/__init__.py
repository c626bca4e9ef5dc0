"""episodekit: prepare LeRobot-format datasets for large-scale training and load them back."""

__version__ = "0.1.0"
