"""Readers of the robot data formats teams hold (RLDS / Open X-Embodiment TFRecords, robomimic /
ALOHA / LIBERO HDF5, diffusion-policy / UMI zarr, ROS bags), for ``episodekit import``.

Each format is one module with one :class:`~episodekit.importers.episode.Reader` subclass: it
lists the source's episodes cheaply and reads one at a time as a
:class:`~episodekit.importers.episode.RawEpisode` (arrays by source key, before the map). What
becomes which LeRobot feature is the map's business (a TOML file, or the reader's built-in one);
writing the dataset is the episode sink's (``episodekit.writers``). A layer of its own on
``core`` only; each format's third-party reader is an optional extra, imported when used.
"""
