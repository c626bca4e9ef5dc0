"""``episodekit import``: a source in another format (see :mod:`episodekit.importers`) through
its map into the episode sink (:mod:`episodekit.writers.sink`), staged next to ``--out``,
verified, published atomically, rerun-safe.

The reader lists the episodes; each is read, mapped (:func:`~episodekit.importers.mapping.
apply_map`: casts, concatenations, quirks refused or skipped as the map says) and written
before the next is read. Everything goes into a hidden staging folder next to ``--out``
(:mod:`episodekit.core.staging`), swapped into place under ``--out``'s writer lock once
verified: a failure anywhere (a corrupt episode in the middle) publishes nothing. A rerun whose
inputs (every source file's name, size and mtime, the map, the options, the tool version)
match the key recorded in ``--out`` does nothing.

Resume: each time the sink closes a full data file (and the cameras' mp4s with it, all read
back and checked) it calls back here, and the staging folder's journal (``.episodekit-import/
journal.json``, written atomically) records the inputs key, the source episodes consumed and
the sink's state. A run killed (``kill -9``) leaves that folder; the next run with the same key
takes it over (:func:`episodekit.core.staging.take_over`: ours by its marker, its writer gone),
keeps what the journal lists, removes the rest, and starts at the first episode of the first
unfinished file. Another key: the folder is removed as any killed run's (only a folder named
and marked as ours). The journal and the episodes' parts are removed before the publish.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from episodekit.core import crashpoint
from episodekit.core import staging as staging_mod
from episodekit.core.atomic import atomic_write_text
from episodekit.core.errors import DatasetError
from episodekit.core.lock import remove_if_only_lock, writer_lock
from episodekit.core.outdir import check_output_dir, mark_output_dir
from episodekit.core.progress import current
from episodekit.core.version import __version__
from episodekit.importers.mapping import (
    MAX_FPS,
    ImportMap,
    MapError,
    Skip,
    apply_map,
    check_task,
    dump_map,
    load_map,
    parse_map,
)
from episodekit.importers.registry import detect, reader_class

RECIPE_FILE = ".episodekit-import.json"  # at the output's root: what it was imported from
WHAT = "episodekit import"
JOURNAL = "journal.json"  # in the staging folder's parts: what a killed run finished


@dataclass(frozen=True)
class ImportOptions:
    """``--format`` (None: detected), ``--map``, ``--fps``, ``--video``, ``--jobs``,
    ``--data-mb``, ``--video-mb`` (LeRobot's file sizes), ``--executor`` (where the episodes
    are read and mapped: ``local`` processes or Ray tasks; not part of the inputs key, the
    output is the same bytes)."""

    fmt: str | None = None
    map_path: str | None = None
    fps: float | None = None
    video: str = "av1"
    jobs: int = 1
    data_mb: float = 100.0
    video_mb: float = 200.0
    executor: str = "local"


@dataclass
class ImportResult:
    out: str
    status: str  # "written", "unchanged" or "dry run"
    format: str
    episodes: int = 0
    frames: int = 0
    tasks: int = 0
    data_files: int = 0
    video_files: int = 0
    seconds: float = 0.0
    features: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    reports: dict[str, Any] = field(default_factory=dict)  # episode -> its reader's figures
    resumed: int = 0  # episodes kept from a killed run (not written again)

    def as_dict(self) -> dict:
        return asdict(self)


def open_reader(src: str, options: ImportOptions) -> Any:
    """The source's reader (its format given or detected)."""
    cls = reader_class(options.fmt) if options.fmt else detect(src)
    if not Path(src).exists():
        raise MapError(f"{src}: no such file or folder")
    return cls(src, {})


def inferred_map(src: str, options: ImportOptions) -> str:
    """The reader's built-in map as TOML (``--print-map``), for the user to edit."""
    reader = open_reader(src, options)
    doc = reader.default_map()
    parse_map(doc, reader.keys(), "the built-in map")  # what is printed must read back
    return dump_map(doc, f"episodekit import map for {src} (format {reader.format})")


def _load(reader: Any, options: ImportOptions) -> tuple[ImportMap, dict, dict]:
    keys = reader.keys()
    if options.map_path:
        doc = load_map(options.map_path)
        name = options.map_path
    else:
        doc, name = reader.default_map(), "the built-in map"
    m = parse_map(doc, keys, name)
    if m.source:  # the map's [source] options: a reader made with them
        reader.options = dict(m.source)
    return m, keys, doc


def _fps(m: ImportMap, reader: Any, options: ImportOptions) -> int:
    fps = options.fps or m.fps or reader.fps()
    if not fps:
        raise MapError("the source records no frame rate; give --fps N or fps = N in the map")
    if not 0 < fps < MAX_FPS:  # --fps inf or a source's rate (the map's is checked when read)
        raise MapError(f"fps {fps!r}: must be a positive number below {MAX_FPS:g}")
    if float(fps) != int(fps):
        raise MapError(f"fps {fps:g}: LeRobot's video needs a whole number of frames per second")
    return int(fps)


def _recipe(src: Path, doc: dict, fmt: str, fps: int, video: str, sizes: tuple) -> str:
    files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
    listing = []
    for p in files:
        st = p.stat()
        listing.append(
            [str(p.relative_to(src)) if p != src else p.name, st.st_size, st.st_mtime_ns]
        )
    blob = [
        __version__,
        fmt,
        fps,
        video,
        doc,
        listing,
        *([list(sizes)] if sizes != (100.0, 200.0) else []),
    ]
    blob = json.dumps(blob, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def run_import(
    src: str, out: str | os.PathLike, options: ImportOptions, dry_run: bool = False
) -> ImportResult:
    """Import ``src`` into a new v3.0 dataset at ``out`` (see the module docstring)."""
    from episodekit.writers.sink import EpisodeSink, features_from_map

    t0 = time.perf_counter()
    if options.jobs < 1:
        raise ValueError(f"--jobs {options.jobs}: expected 1 or more")
    if options.executor not in ("local", "ray"):
        raise ValueError(f"--executor {options.executor!r}: expected local or ray")
    reader = open_reader(src, options)
    m, keys, doc = _load(reader, options)
    fps = _fps(m, reader, options)
    reader.rate = float(fps)
    feats = features_from_map(m, keys, options.video)
    refs = reader.episodes()
    result = ImportResult(
        str(out),
        "dry run" if dry_run else "written",
        reader.format,
        features=[f.name for f in feats],
    )
    if dry_run:
        result.episodes = len(refs)
        result.seconds = time.perf_counter() - t0
        return result
    src_path = Path(src).resolve()
    out_path = check_output_dir(out, sources=[src_path])
    sizes = (float(options.data_mb), float(options.video_mb))
    key = _recipe(src_path, doc, reader.format, fps, options.video, sizes)
    created = not out_path.exists()
    say = current().step
    try:
        with writer_lock(out_path):
            kept = staging_mod.take_over(out_path, lambda f: _journal(f).get("key") == key)
            staging_mod.remove_stale(out_path)
            recorded = _recorded(out_path)
            if recorded.get("key") == key and (out_path / "meta/info.json").exists():
                result.status = "unchanged"
                for k in ("episodes", "frames", "tasks", "data_files", "video_files"):
                    setattr(result, k, int(recorded.get(k, 0)))
            else:
                staging = kept or staging_mod.new_staging(out_path)
                sink = EpisodeSink(
                    staging, feats, fps, m.robot_type, data_mb=options.data_mb,
                    video_mb=options.video_mb,
                )  # fmt: skip
                try:
                    _feed(sink, staging, kept, key, (reader, m, keys, refs), options, result, src)
                    say("verifying the output")
                    written = sink.finish()
                    sink.parts.remove()  # the episodes' parts and the journal: not published
                    mark_output_dir(staging, WHAT)
                    result.episodes, result.frames = written.episodes, written.frames
                    result.tasks, result.data_files = written.tasks, written.data_files
                    result.video_files = written.video_files
                    recipe = {
                        "key": key,
                        "what": WHAT,
                        "source": str(src_path),
                        **{
                            k: getattr(result, k)
                            for k in ("episodes", "frames", "tasks", "data_files", "video_files")
                        },
                    }
                    atomic_write_text(staging / RECIPE_FILE, json.dumps(recipe, indent=2))
                    staging_mod.publish(staging, out_path)
                except BaseException as exc:
                    sink.abort()
                    staging_mod.discard(staging, out_path)
                    from episodekit.core.parquet_write import VerificationError

                    if isinstance(exc, VerificationError):
                        raise DatasetError(
                            f"the output failed verification, nothing was published: {exc}"
                        ) from exc
                    raise
    except BaseException:
        if created:
            remove_if_only_lock(out_path)
        raise
    result.seconds = time.perf_counter() - t0
    return result


def _feed(
    sink: Any,
    staging: Path,
    kept: Path | None,
    key: str,
    source: tuple,
    options: ImportOptions,
    result: ImportResult,
    src: str,
) -> None:
    """Every episode into ``sink``; a kept (killed) run's staging carried on from its journal's
    checkpoint, each new checkpoint journaled (the source episodes consumed, the skips)."""
    reader, m, keys, refs = source
    say = current().step
    start = 0
    if kept is not None:
        journal = _journal(kept)
        sink.restore(journal["state"])
        start, result.skipped = int(journal["refs"]), list(journal["skipped"])
        result.resumed = int(journal["state"]["episodes"])
        say(
            f"resuming a killed import: {result.resumed} episodes kept (verified), "
            f"{len(refs) - start} of {len(refs)} to go"
        )
    else:
        say(f"importing {len(refs)} {reader.format} episodes from {src}")
    at = [start]
    sink.on_checkpoint = lambda state: _write_journal(staging, key, at[0], result.skipped, state)
    for at[0], mapped in enumerate(_mapped(reader, m, keys, refs[start:], options), start):
        if isinstance(mapped, str):
            result.skipped.append(mapped)
        else:
            if mapped.report:  # a resumed run reports only the episodes it read itself
                result.reports[mapped.source] = mapped.report
            sink.add(mapped)
    sink.drain()  # the last episodes' videos encoded (an error in them is the feeding's)


def _prepare(ref: Any, reader: Any, m: ImportMap, keys: dict, decode: bool) -> Any:
    """One episode read and mapped (a skip: its reason); with ``decode`` (a worker process)
    its images read, so what crosses to the writer is plain values: image files (PNG/JPEG)
    as they are (the sink's camera processes decode them), other images decoded."""
    file = _file(reader, ref)
    try:
        mapped = apply_map(reader.read(ref), m, keys, file)
    except Skip as skip:
        return skip.reason
    check_task(mapped.tasks, mapped.source, file)
    if decode:
        import numpy as np

        from episodekit.importers.episode import ArrayImages, EncodedImages

        mapped.images = {
            k: (
                img if type(img) is EncodedImages else ArrayImages(np.stack(list(img.frames()))),
                ch,
            )
            for k, (img, ch) in mapped.images.items()
        }
    return mapped


def _prepare_job(ref: Any, shared: tuple) -> Any:
    """:func:`_prepare` in a worker (a process of the pool or a Ray task): ``shared`` is the
    reader, the map and the source's keys."""
    reader, m, keys = shared
    return _prepare(ref, reader, m, keys, True)


def _mapped(
    reader: Any, m: ImportMap, keys: dict, refs: list, options: ImportOptions
) -> Iterator[Any]:
    """The episodes read and mapped, in source order: in this process (``--jobs 1``, local),
    else in ``--jobs`` 'spawn' processes or as Ray tasks (``--executor ray``: the reader, map
    and keys put in Ray's object store once), at most ``2 * jobs`` episodes ahead of the writer
    (memory: a bounded number of episodes; :func:`episodekit.core.executor.imap_ordered`). The
    writer takes them in order either way, so the output is the same bytes whatever ``jobs``
    and the executor."""
    if options.jobs == 1 and options.executor == "local":
        for ref in refs:
            yield _prepare(ref, reader, m, keys, False)
        return
    from episodekit.core.executor import imap_ordered

    shared = (reader, m, keys)
    yield from imap_ordered(_prepare_job, refs, options.executor, options.jobs, shared=shared)


def _file(reader: Any, ref: Any) -> str:
    return reader.file(ref)


def _journal_path(staging: Path) -> Path:
    from episodekit.writers.import_parts import PARTS_DIR

    return Path(staging) / PARTS_DIR / JOURNAL


def _journal(staging: Path) -> dict:
    """A staging folder's journal (empty when it has none or it does not read)."""
    try:
        doc = json.loads(_journal_path(staging).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) and isinstance(doc.get("state"), dict) else {}


def _write_journal(staging: Path, key: str, refs: int, skipped: list, state: dict) -> None:
    """The checkpoint's journal, atomically: the inputs' key, the source episodes consumed
    (``refs``: the next one starts the first unfinished file), the skips, the sink's state."""
    doc = {"key": key, "refs": refs, "skipped": list(skipped), "state": state}
    atomic_write_text(_journal_path(staging), json.dumps(doc))
    crashpoint.reached("import: checkpoint")


def _recorded(out: Path) -> dict:
    try:
        doc = json.loads((out / RECIPE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
