"""Episode cost table ``meta/episode_costs.parquet``: what each episode costs to load and train on.

Episodes differ in length by 10-100x, so shard plans balance *cost*, not episode counts. The table
has one row per episode: episode_index, task_index, length, num_cameras (image + video features),
action_dim, data_bytes (the episode's share of its data file, prorated by rows over the compressed
row-group sizes in the parquet footer: no data pages are read), video_bytes (its share of each
camera's mp4, prorated by duration; null when the video files are absent, which only the
``bytes`` model refuses), and ``cost`` under one model:

- ``frames``: length (the default: one sample per frame);
- ``compute``: length x action_dim x cameras (each factor at least 1);
- ``bytes``: data_bytes + video_bytes (I/O bound training);
- ``decode``: the measured seconds to decode the episode's video frames, summed over cameras
  (decode-bound training): per mp4, ``DECODE_SAMPLE_FRAMES`` random frames are decoded the way the
  loader reads them (seek to the keyframe before each, decode forward) and timed; an episode costs
  length x that file's seconds per frame. The per-file timings, backend and settings are stored
  in the table's metadata, so a fresh table is never re-measured and its costs can be checked.

The model name, format version and episodes fingerprint are stored in the file's key-value
metadata (key ``episodekit.costs``) so a reader can tell a stale table from a fresh one.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pyarrow as pa

from episodekit.core.atomic import atomic_path
from episodekit.core.dataset import (
    Dataset,
    DatasetError,
    MissingFileError,
    as_dataset,
)
from episodekit.core.footer import file_layout
from episodekit.core.parquet_read import table_from_bytes
from episodekit.core.parquet_write import write_table
from episodekit.core.paths import COST_FILE, COST_MODELS
from episodekit.metadata.artifact import (
    FORMAT,
    FRESH,
    Problem,
    artifact_path,
    local_target,
    read_bytes,
)

COST_VERSION = 1
COST_META_KEY = b"episodekit.costs"
COST_SCHEMA = pa.schema(
    [
        ("episode_index", pa.int64()),
        ("task_index", pa.int64()),
        ("length", pa.int64()),
        ("num_cameras", pa.int32()),
        ("action_dim", pa.int32()),
        ("data_bytes", pa.int64()),
        ("video_bytes", pa.int64()),
        ("cost", pa.float64()),
    ]
)


def check_model(model: str) -> str:
    """Return ``model`` or raise a ValueError listing the known cost models."""
    if model not in COST_MODELS:
        raise ValueError(f"unknown cost model {model!r} (choose from {', '.join(COST_MODELS)})")
    return model


def _prorate(total: np.ndarray, lo: np.ndarray, hi: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Integer shares of a piecewise-uniform quantity: ``bounds`` are cumulative positions where
    the cumulative ``total`` is known; an interval [lo, hi) gets round(C(hi)) - round(C(lo)), so
    the shares of intervals that tile the file add up to the file total exactly."""
    c_hi = np.rint(np.interp(hi, bounds, total))
    c_lo = np.rint(np.interp(lo, bounds, total))
    return (c_hi - c_lo).astype(np.int64)


def data_bytes(ds: Dataset) -> np.ndarray:
    """Per episode (episode-table order): its share of its data file's compressed row-group bytes,
    prorated by rows inside each row group. Reads parquet footers only."""
    n = ds.num_episodes
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out
    file_id = ds.column("file_id").astype(np.int64)
    frm = ds.column("dataset_from_index")
    to = ds.column("dataset_to_index")
    order = np.argsort(file_id, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(file_id[order])) + 1)
    for rows in groups:
        path = ds.data_path(int(file_id[rows[0]]))
        try:
            layout = file_layout(path, ds.fs)
        except FileNotFoundError as exc:
            raise MissingFileError("data file is missing", path) from exc
        except (OSError, pa.ArrowInvalid) as exc:
            raise DatasetError(f"unreadable parquet footer ({exc})", path) from exc
        first = frm[rows].min()
        if to[rows].max() - first > layout.num_rows:
            raise DatasetError(
                f"episodes {ds.column('episode_index')[rows][:5].tolist()} need "
                f"{to[rows].max() - first} rows but the file has {layout.num_rows}",
                path,
            )
        bounds = np.concatenate([[0], np.cumsum(layout.row_group_rows)]).astype(np.float64)
        cum = np.concatenate([[0], np.cumsum(layout.row_group_compressed)]).astype(np.float64)
        out[rows] = _prorate(cum, frm[rows] - first, to[rows] - first, bounds)
    return out


def video_bytes(ds: Dataset, strict: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per episode: the sum over cameras of its share of that camera's mp4, prorated by duration
    (to_timestamp - from_timestamp) over the episodes stored in the same file; and a mask of the
    episodes whose video files are missing (``strict``: raise MissingFileError naming the file
    instead; a root prepared into a separate folder may hold no videos)."""
    n = ds.num_episodes
    out = np.zeros(n, dtype=np.int64)
    unknown = np.zeros(n, dtype=bool)
    for key in ds.video_keys:
        cols = [f"videos/{key}/{f}" for f in ("chunk_index", "file_index", "from_timestamp")]
        cols.append(f"videos/{key}/to_timestamp")
        if n == 0 or not all(c in ds.episodes.column_names for c in cols):
            continue
        df = pl.from_arrow(ds.episodes.select(cols)).rename(
            dict(zip(cols, ("chunk", "file", "lo", "hi")))
        )
        df = df.with_row_index("row").with_columns(
            (pl.col("hi") - pl.col("lo")).clip(lower_bound=0).alias("dur")
        )
        files = df.select("chunk", "file").unique().sort("chunk", "file")
        sizes = []
        for chunk, fnum in files.iter_rows():
            full = ds.safe_join(ds.video_path(key, int(chunk), int(fnum)))
            if ds.fs.exists(full):
                sizes.append(int(ds.fs.size(full)))
            elif strict:
                raise MissingFileError(f"video file of camera {key!r} is missing", full)
            else:
                sizes.append(None)
        files = files.with_columns(pl.Series("size", sizes, dtype=pl.Int64))
        df = (
            df.join(files, on=["chunk", "file"], how="left")
            .sort("chunk", "file", "lo", "row")
            .with_columns(
                pl.col("dur").cum_sum().over("chunk", "file").alias("cum"),
                pl.col("dur").sum().over("chunk", "file").alias("tot"),
            )
            .with_columns(
                pl.when(pl.col("tot") > 0)
                .then(pl.col("size") / pl.col("tot"))
                .otherwise(0.0)
                .alias("per_s")
            )
            .with_columns(
                (
                    (pl.col("cum") * pl.col("per_s")).round(0)
                    - ((pl.col("cum") - pl.col("dur")) * pl.col("per_s")).round(0)
                )
                .cast(pl.Int64)
                .alias("share")
            )
        )
        rows = df["row"].to_numpy()
        unknown[rows] |= df["share"].is_null().to_numpy()
        out[rows] += df["share"].fill_null(0).to_numpy()
    return out, unknown


DECODE_SAMPLE_FRAMES = 16
DECODE_SETTINGS = {"backend": "pyav", "access": "random", "threads": 1, "seed": 0}


def decode_seconds(
    ds: Dataset, sample_frames: int = DECODE_SAMPLE_FRAMES, seed: int = 0
) -> dict[str, float]:
    """Measured seconds per frame of every referenced mp4 (relative path -> s/frame): decode
    ``sample_frames`` random frames of it one at a time, as random access does."""
    from episodekit.core.video import random_access_seconds

    out: dict[str, float] = {}
    for key in ds.video_keys:
        chunk = ds.column(f"videos/{key}/chunk_index")
        fidx = ds.column(f"videos/{key}/file_index")
        for c, f in sorted(set(zip(chunk.tolist(), fidx.tolist()))):
            rel = ds.video_path(key, int(c), int(f))
            full = ds.join(rel)
            if not ds.fs.exists(full):
                raise MissingFileError(f"video file of camera {key!r} is missing", full)
            out[rel] = random_access_seconds(
                full, sample_frames, seed=seed, threads=DECODE_SETTINGS["threads"]
            )
    return out


def _decode_cost(ds: Dataset, per_file: dict[str, float]) -> np.ndarray:
    """Per episode: length x seconds per frame of its file, summed over cameras."""
    length = ds.column("length").astype(np.float64)
    cost = np.zeros(ds.num_episodes)
    for key in ds.video_keys:
        chunk = ds.column(f"videos/{key}/chunk_index")
        fidx = ds.column(f"videos/{key}/file_index")
        pairs, inverse = np.unique(np.stack([chunk, fidx], 1), axis=0, return_inverse=True)
        rels = [ds.video_path(key, int(c), int(f)) for c, f in pairs]
        missing = [r for r in rels if r not in per_file]
        if missing:
            raise DatasetError(f"no decode timing for {missing[0]}", COST_FILE)
        spf = np.array([per_file[r] for r in rels])
        cost += length * spf[inverse.ravel()]
    return cost


def _action_dim(ds: Dataset) -> int:
    shape = (ds.features.get("action") or {}).get("shape") or [0]
    return int(np.prod(shape))


def compute_costs(
    ds: Dataset | str, model: str = "frames", decode_per_file: dict[str, float] | None = None
) -> pa.Table:
    """The cost table of a dataset (see the module docstring), in episode order.

    ``decode_per_file`` (model ``decode``): reuse these seconds per frame instead of measuring."""
    check_model(model)
    ds = as_dataset(ds)
    decode_meta: dict = {}
    if model == "decode":
        if not ds.video_keys:
            raise ValueError("the decode cost model needs video features; this root has none")
        if decode_per_file is None:
            decode_per_file = decode_seconds(ds)
        decode_meta = {
            "decode": {
                **DECODE_SETTINGS,
                "sample_frames": DECODE_SAMPLE_FRAMES,
                "seconds_per_frame": decode_per_file,
            }
        }
    n = ds.num_episodes
    length = ds.column("length").astype(np.int64)
    cameras = len(ds.image_keys) + len(ds.video_keys)
    adim = _action_dim(ds)
    dbytes = data_bytes(ds)
    vbytes, unknown = video_bytes(ds, strict=model == "bytes")
    if model == "frames":
        cost = length.astype(np.float64)
    elif model == "compute":
        cost = length.astype(np.float64) * max(1, adim) * max(1, cameras)
    elif model == "decode":
        cost = _decode_cost(ds, decode_per_file)
    else:
        cost = (dbytes + vbytes).astype(np.float64)
    table = pa.table(
        {
            "episode_index": ds.column("episode_index").astype(np.int64),
            "task_index": ds.column("task_index").astype(np.int64),
            "length": length,
            "num_cameras": np.full(n, cameras, dtype=np.int32),
            "action_dim": np.full(n, adim, dtype=np.int32),
            "data_bytes": dbytes,
            "video_bytes": pa.array(vbytes, mask=unknown),
            "cost": cost,
        },
        schema=COST_SCHEMA,
    )
    meta = {"version": COST_VERSION, "model": model, "fingerprint": ds.fingerprint, **decode_meta}
    return table.replace_schema_metadata({COST_META_KEY: json.dumps(meta, sort_keys=True).encode()})


def recompute_costs(table: pa.Table, ds: Dataset) -> pa.Table:
    """A stored table recomputed for comparison: same model; ``decode`` reuses the stored
    per-file timings (a measurement is not repeatable, the arithmetic on it is)."""
    meta = costs_meta(table)
    per_file = (meta.get("decode") or {}).get("seconds_per_frame")
    return compute_costs(ds, meta.get("model", "frames"), decode_per_file=per_file)


def costs_meta(table: pa.Table) -> dict:
    """The ``episodekit.costs`` metadata of a cost table ({} when absent)."""
    raw = (table.schema.metadata or {}).get(COST_META_KEY)
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


def write_costs(ds: Dataset | str, model: str = "frames", table: pa.Table | None = None) -> str:
    """Compute (unless ``table`` is given) and atomically write the cost table; return its path."""
    ds = as_dataset(ds)
    table = table if table is not None else compute_costs(ds, model)
    path = local_target(ds, COST_FILE)
    with atomic_path(path) as tmp:
        write_table(table, tmp, compression="zstd")
    return path


def read_costs(root_or_ds: str | Dataset) -> pa.Table | None:
    """The stored cost table (with its metadata), or None when the root has none."""
    data = read_bytes(root_or_ds, COST_FILE)
    if data is None:
        return None
    try:
        # From arrow-owned bytes, never a Python object (apache/arrow#34314: abort at exit).
        return table_from_bytes(data)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DatasetError(
            f"unreadable cost table ({exc})", artifact_path(root_or_ds, COST_FILE)
        ) from exc


def costs_for(
    root: str | Dataset, model: str = "frames", force: bool = False
) -> tuple[pa.Table, bool]:
    """The cost table for ``model``: the stored one when it is fresh (same fingerprint, model and
    version), else computed, not written (``metadata plan`` writes it with the plans, so a plan
    that fails leaves no file). Returns ``(table, computed)``."""
    check_model(model)
    ds = as_dataset(root)
    if not force:
        table = read_costs(ds)
        if table is not None and not verify_costs(table, ds, model):
            return table, False
    return compute_costs(ds, model), True


def ensure_costs(
    root: str | Dataset, model: str = "frames", force: bool = False
) -> tuple[pa.Table, bool]:
    """The cost table for ``model``: the stored one when it is fresh (same fingerprint, model and
    version), else computed and written. Returns ``(table, changed)``."""
    ds = as_dataset(root)
    table, computed = costs_for(ds, model, force)
    if computed:
        write_costs(ds, model, table)
    return table, computed


def verify_costs(table: pa.Table, ds: Dataset, model: str | None = None) -> list[Problem]:
    """Problems with a cost table against ``ds`` (empty when it is fresh and complete)."""
    problems = []
    meta = costs_meta(table)
    if meta.get("version") != COST_VERSION:
        problems.append(
            Problem(f"cost table version {meta.get('version')!r}, expected {COST_VERSION}", FORMAT)
        )
    if meta.get("fingerprint") != ds.fingerprint:
        problems.append(
            Problem(
                f"cost table is stale: fingerprint {meta.get('fingerprint')!r}, dataset has "
                f"{ds.fingerprint!r}",
                FRESH,
            )
        )
    if meta.get("model") not in COST_MODELS:
        problems.append(Problem(f"unknown cost model {meta.get('model')!r}", FORMAT))
    elif model is not None and meta.get("model") != model:
        problems.append(Problem(f"cost model is {meta.get('model')!r}, wanted {model!r}", FRESH))
    missing = [c for c in COST_SCHEMA.names if c not in table.column_names]
    if missing:
        return problems + [Problem(f"cost table lacks columns {missing}", FORMAT)]
    ep = table["episode_index"].to_numpy()
    if not np.array_equal(ep, ds.column("episode_index")):
        problems.append(
            Problem("cost table rows do not match the dataset's episodes one to one, in order")
        )
    elif not np.array_equal(table["length"].to_numpy(), ds.column("length")):
        problems.append(Problem("cost table lengths differ from the episodes table"))
    cost = table["cost"].to_numpy()
    if len(cost) and (not np.all(np.isfinite(cost)) or cost.min() < 0):
        problems.append(Problem("cost table has negative or non-finite costs"))
    return problems
