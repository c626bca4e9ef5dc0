"""Synthetic datasets in the exact LeRobot v3.0 (or v2.1) layout: the test data of the tests,
the demo and the benchmarks (``episodekit sample`` writes one).

What it reproduces from LeRobot's own writers: ``meta/info.json`` with the feature contract,
``meta/tasks.parquet`` with the task string as the pandas index, ``meta/episodes/`` with the
per-episode ``stats/*`` columns, data files holding many episodes and rolling over at
``data_files_size_in_mb`` (chunks at ``chunks_size`` files), the ``huggingface`` schema metadata,
and the two row-group styles found in the wild: ``recorded`` (one row group per episode, what the
recorder writes) and ``edited`` (one row group per file, what the editing tools write).
Everything is generated with column operations, one file at a time.

Modules: :mod:`~episodekit.sample.spec` (what a sample is), :mod:`~episodekit.sample.tables`
(its tables), :mod:`~episodekit.sample.video` (its cameras), :mod:`~episodekit.sample.writer`
(the files). A layer of its own above the library (it uses ``core``, ``metadata`` and the
episode sink's data files in ``writers``), below the CLI; nothing else in the package imports it.
"""

from episodekit.core.lazy import lazy_getattr

_EXPORTS = {
    "SampleSpec": "episodekit.sample.spec",
    "STYLES": "episodekit.sample.spec",
    "VERSIONS": "episodekit.sample.spec",
    "episode_lengths_and_tasks": "episodekit.sample.tables",
    "features_for": "episodekit.sample.tables",
    "tiny_png": "episodekit.sample.tables",
    "read_frame_code": "episodekit.sample.video",
    "synthetic_frames": "episodekit.sample.video",
    "write_sample": "episodekit.sample.writer",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
