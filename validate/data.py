"""Data-file checks: one duckdb scan of per-episode aggregates, compared with the episodes table.

The scan never brings frames into Python: duckdb reads the files (all of them in one query, on
every core, or one file per task through :mod:`.executor` with ``executor="ray"``) and returns one
row per (file, episode) with counts, index/frame_index/timestamp/task_index summaries and
null / non-finite counts per feature column. Comparing those rows with the episodes table is
vectorized polars/numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from episodekit.core import interrupt
from episodekit.core.dataset import read_schema
from episodekit.validate.meta import MAX_PER_KIND, local_or_fs_path
from episodekit.validate.raw import ERROR, Finding, RawRoot, unreadable_parquet

CORE = ("episode_index", "index", "frame_index", "timestamp", "task_index")
FLOAT_TYPES = ("FLOAT", "DOUBLE")
HELPER_COLUMNS = ("filename", "file_row_number")  # what the scan adds to a file's columns
IMAGE_MAGIC = (
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",
    b"RIFF",
    b"GIF8",
    b"BM",
    b"II*\x00",
    b"MM\x00*",
)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _blob(b: bytes) -> str:
    return "'" + "".join(f"\\x{c:02x}" for c in b) + "'::BLOB"


def _scan_sql(
    source: str,
    types: dict[str, str],
    fps: float,
    feature_columns: Sequence[str],
    shapes: dict[str, int] | None,
    deep: bool,
) -> str:
    """SQL for per-(file, episode) aggregates of ``source`` (a relation with the columns
    ``filename`` and ``file_row_number`` besides the file's); ``types`` maps column -> duckdb
    type name."""

    def col(name: str, expr: str, default: str = "NULL::BIGINT") -> str:
        return expr if name in types else default

    sel = [
        "filename AS file",
        "episode_index",
        "count(*) AS rows",
        col("index", "min(index)") + " AS index_min",
        col("index", "max(index)") + " AS index_max",
        col("index", "sum(index::HUGEINT)::DOUBLE") + " AS index_sum",
        col("frame_index", "min(frame_index)") + " AS fi_min",
        col("frame_index", "max(frame_index)") + " AS fi_max",
        col("frame_index", "sum(frame_index::HUGEINT)::DOUBLE") + " AS fi_sum",
        col("frame_index", "sum((frame_index::HUGEINT) * frame_index)::DOUBLE") + " AS fi_sq",
        col("index", col("frame_index", "min(index - frame_index)")) + " AS offset_min",
        col("index", col("frame_index", "max(index - frame_index)")) + " AS offset_max",
        # Row order: index - (row number in the file) is one constant per file when the rows
        # are in index order; checked per episode here and across a file's episodes in compare.
        col("index", "min(index - file_row_number)") + " AS order_min",
        col("index", "max(index - file_row_number)") + " AS order_max",
        col(
            "timestamp",
            col("frame_index", f"max(abs(timestamp::DOUBLE - frame_index / {float(fps)!r}))"),
            "NULL::DOUBLE",
        )
        + " AS ts_err",
        col("timestamp", "max(timestamp)::DOUBLE", "NULL::DOUBLE") + " AS ts_max",
        col("task_index", "min(task_index)") + " AS task_min",
        col("task_index", "max(task_index)") + " AS task_max",
    ]
    for name in feature_columns:
        if name not in types:
            continue
        t = types[name]
        q = _q(name)
        sel.append(f"count(*) - count({q}) AS {_q('nulls:' + name)}")
        is_list = t.endswith("]")
        base = t.split("[", 1)[0]
        if is_list:
            sel.append(f"count_if(list_count({q}) <> len({q})) AS {_q('elem_nulls:' + name)}")
            if base in FLOAT_TYPES:
                sel.append(f"count_if(NOT isfinite(list_sum({q}))) AS {_q('nonfinite:' + name)}")
            if shapes and name in shapes:  # cheap (list lengths only): always on
                sel.append(f"count_if(len({q}) <> {int(shapes[name])}) AS {_q('shape:' + name)}")
        elif base in FLOAT_TYPES:
            sel.append(f"count_if(NOT isfinite({q})) AS {_q('nonfinite:' + name)}")
        elif deep and t.startswith("STRUCT") and "bytes BLOB" in t:
            magic = " OR ".join(f"({q}.bytes)[1:{len(m)}] = {_blob(m)}" for m in IMAGE_MAGIC)
            sel.append(
                f"count_if({q}.bytes IS NOT NULL AND NOT ({magic})) AS {_q('image:' + name)}"
            )
    return (
        f"SELECT {', '.join(sel)} FROM {source} "
        "GROUP BY filename, episode_index ORDER BY filename, episode_index"
    )


def _connect(threads: int | None = None) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    con.execute("SET enable_progress_bar = false")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    return con


def scan_data_files(
    paths: Sequence[str],
    fps: float,
    feature_columns: Sequence[str],
    shapes: dict[str, int] | None = None,
    deep: bool = False,
    fs=None,
) -> pl.DataFrame:
    """Per-(file, episode) aggregates of data files that share one schema, in one duckdb query.

    Columns: file, episode_index, rows, index_min/max/sum, fi_min/max/sum/sq (frame_index),
    offset_min/max (index - frame_index), ts_err (max |timestamp - frame_index/fps|), ts_max,
    task_min/max, and per feature column ``nulls:<col>``, ``elem_nulls:<col>`` (lists),
    ``nonfinite:<col>`` (floats), ``shape:<col>`` (lists with a declared length), order_min/max
    (index - row number in the file), with ``deep`` also ``image:<col>``.
    """
    con = _connect()
    if fs is not None:
        con.register_filesystem(fs)
    paths = list(paths)
    files = "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"
    described = con.sql(f"DESCRIBE SELECT * FROM read_parquet({files})").fetchall()
    types = {row[0]: str(row[1]) for row in described}
    source = f"read_parquet({files}, filename=true, file_row_number=true)"
    sql = _scan_sql(source, types, fps, feature_columns, shapes, deep)
    return con.sql(sql).pl()


def scan_table(
    table: pa.Table,
    fps: float,
    feature_columns: Sequence[str],
    shapes: dict[str, int] | None = None,
    deep: bool = False,
) -> pl.DataFrame:
    """The aggregates of :func:`scan_data_files` over rows already read (a sample's row groups):
    ``table`` holds the file's columns plus ``filename`` and ``file_row_number`` (the row's place
    in its file)."""
    con = _connect()
    con.register("rows_read", table)
    described = con.sql("DESCRIBE SELECT * FROM rows_read").fetchall()
    types = {row[0]: str(row[1]) for row in described if row[0] not in HELPER_COLUMNS}
    sql = _scan_sql("rows_read", types, fps, feature_columns, shapes, deep)
    return con.sql(sql).pl()


def scan_data_file(
    path: str,
    fps: float,
    feature_columns: Sequence[str],
    shapes: dict[str, int] | None = None,
    deep: bool = False,
) -> pl.DataFrame:
    """Per-episode aggregates of one data file (what :func:`scan_data_files` gives for it);
    the unit of work when the scan runs per file on ray."""
    return scan_data_files([path], fps, feature_columns, shapes, deep)


def _scan_job(args: tuple) -> pl.DataFrame:
    return scan_data_file(*args)


def read_schemas(raw: RawRoot, rels: Sequence[str]) -> tuple[dict[str, pa.Schema], list[Finding]]:
    """Arrow schemas of the existing data files; unreadable ones become ``data.read`` findings."""
    schemas, out = {}, []
    for rel in rels:
        full = raw.join(rel)
        if not raw.fs.exists(full):
            continue
        try:
            schemas[rel] = read_schema(raw.fs, full)
        except Exception as exc:  # noqa: BLE001 - any reader failure is the file's fault
            interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
            msg = f"unreadable parquet: {unreadable_parquet(exc, raw.root)}"
            out.append(Finding("data.read", ERROR, msg, rel))
    return schemas, out


def scan_options(raw: RawRoot) -> tuple[list[str], dict[str, int]]:
    """The scan's feature columns (every declared feature stored in the data files) and the
    declared lengths of its one-dimensional list features."""
    stored = [
        k for k, f in raw.features.items() if isinstance(f, dict) and f.get("dtype") != "video"
    ]
    shapes = {
        k: int(f["shape"][0])
        for k, f in raw.features.items()
        if isinstance(f, dict)
        and isinstance(f.get("shape"), list)
        and len(f["shape"]) == 1
        and f["shape"][0] != 1
    }
    return stored, shapes


def scan_root(
    raw: RawRoot,
    schemas: dict[str, pa.Schema],
    deep: bool = False,
    executor: str = "local",
) -> pl.DataFrame | None:
    """Scan every readable data file: one query per distinct schema (normally one) or, with
    ``executor="ray"``, one ray task per file. ``file`` in the result is relative to the root."""
    if raw.fps is None or not schemas:
        return None
    stored, shapes = scan_options(raw)
    groups: dict[tuple, list[str]] = {}
    for rel, schema in schemas.items():
        if "episode_index" not in schema.names:
            continue  # reported by info.features; nothing to group by
        key = tuple((f.name, str(f.type)) for f in schema)
        groups.setdefault(key, []).append(rel)
    parts = []
    full_to_rel = {}
    for rels in groups.values():
        paths = [local_or_fs_path(raw, r) for r in rels]
        full_to_rel.update(zip(paths, rels))
        if executor == "local":
            fs = None if paths[0] == raw.join(rels[0]) else raw.fs
            parts.append(scan_data_files(paths, raw.fps, stored, shapes, deep, fs=fs))
        else:
            from episodekit.core.executor import map_files

            jobs = [(p, raw.fps, stored, shapes, deep) for p in paths]
            parts.extend(map_files(_scan_job, jobs, executor=executor))
    if not parts:
        return None
    df = pl.concat(parts, how="diagonal_relaxed")
    return df.with_columns(pl.col("file").replace_strict(full_to_rel, default=pl.col("file")))


def _finding_rows(
    df: pl.DataFrame, check: str, mask: pl.Expr, message: pl.Expr, limit: int = MAX_PER_KIND
) -> list[Finding]:
    bad = df.filter(mask)
    rows = bad.head(limit).select(
        pl.col("data_file"), pl.col("episode_index"), message.alias("msg")
    )
    out = [
        Finding(check, ERROR, m, f, None if e is None else int(e)) for f, e, m in rows.iter_rows()
    ]
    if bad.height > limit:
        first = bad.row(limit, named=True)
        out.append(
            Finding(
                check,
                ERROR,
                f"... and {bad.height - limit} more episodes with the same problem",
                first["data_file"],
                first["episode_index"],
            )
        )
    return out


def timestamp_tolerance(ts_max: np.ndarray) -> np.ndarray:
    """Allowed |timestamp - frame_index/fps|: 1e-4 s (LeRobot's default) plus float32 rounding
    of the largest timestamp (timestamps are float32; long episodes lose precision)."""
    return 1e-4 + np.abs(ts_max) * 2.0**-22


def compare(
    raw: RawRoot, agg: pl.DataFrame, scanned: set[str], only: Sequence[int] | None = None
) -> list[Finding]:
    """Compare per-(file, episode) aggregates with the episodes table. ``only``: judge these
    episodes alone (a sample whose row groups were read; rows of other known episodes in those
    groups are left out, rows of unknown episodes are still strays)."""
    if raw.episodes is None:
        return []
    e = pl.from_arrow(
        raw.episodes.select(
            ["episode_index", "length", "dataset_from_index", "dataset_to_index"]
            + ["task_index", "task_lo", "task_hi", "data_file"]
        )
    ).unique(subset="episode_index", keep="first", maintain_order=True)
    # The file's first index (what data.order expects index - row number to be), from every
    # episode the table places in the file, before a sample narrows the table.
    e = e.with_columns(pl.col("dataset_from_index").min().over("data_file").alias("file_first"))
    if only is not None:
        keep = pl.col("episode_index").is_in(list(only))
        unknown = ~pl.col("episode_index").is_in(e["episode_index"].implode())
        agg = agg.filter(keep | unknown.fill_null(True))
        e = e.filter(keep)
    out = _stray_findings(agg, e)
    own = agg.rename({"file": "data_file"})
    df = e.filter(pl.col("data_file").is_in(list(scanned))).join(
        own, on=["episode_index", "data_file"], how="left"
    )
    df = df.with_columns(pl.col("rows").fill_null(0))
    L = pl.col("length")
    rows_ok = pl.col("rows") == L
    out += _finding_rows(
        df,
        "data.rows",
        ~rows_ok,
        pl.format("{} rows in the data file but length is {}", pl.col("rows"), L),
    )
    short_files = df.filter(~rows_ok)["data_file"].unique().to_list()  # order means nothing there
    df = df.filter(rows_ok & (pl.col("rows") > 0))
    fi_ok, index_ok, found = _index_findings(df)
    out += found
    out += _order_findings(df.filter(~pl.col("data_file").is_in(short_files)), index_ok)
    out += _timestamp_findings(raw, df.filter(fi_ok))  # judged against a sound frame_index
    out += _task_findings(raw, df)
    out += _value_findings(df)
    return out


def _stray_findings(agg: pl.DataFrame, e: pl.DataFrame) -> list[Finding]:
    """``data.file``: rows of an episode in a file the table does not point it at (or of an
    unknown episode, or with a null episode_index)."""
    placed = agg.join(
        e.select("episode_index", pl.col("data_file").alias("expected")),
        on="episode_index",
        how="left",
    )
    stray = placed.filter(pl.col("expected").is_null() | (pl.col("expected") != pl.col("file")))
    stray = stray.rename({"file": "data_file"})
    return _finding_rows(
        stray,
        "data.file",
        pl.lit(True),
        pl.when(pl.col("episode_index").is_null())
        .then(pl.format("{} rows with a null episode_index", pl.col("rows")))
        .when(pl.col("expected").is_null())
        .then(pl.format("{} rows of an episode that is not in the episodes table", pl.col("rows")))
        .otherwise(
            pl.format(
                "{} rows of this episode, but the episodes table places it in {}",
                pl.col("rows"),
                pl.col("expected"),
            )
        ),
    )


def _index_findings(df: pl.DataFrame) -> tuple[pl.Expr, pl.Expr, list[Finding]]:
    """``data.frame_index`` (0..length-1 once each) and ``data.index`` (contiguous from
    dataset_from_index); returns both conditions for the checks that build on them."""
    L = pl.col("length")
    frm = pl.col("dataset_from_index")
    Lf = L.cast(pl.Float64)
    fi_ok = (
        (pl.col("fi_min") == 0)
        & (pl.col("fi_max") == L - 1)
        & (pl.col("fi_sum") == Lf * (Lf - 1) / 2)
        & (pl.col("fi_sq") == (Lf - 1) * Lf * (2 * Lf - 1) / 6)
    ).fill_null(False)
    out = _finding_rows(
        df,
        "data.frame_index",
        ~fi_ok,
        pl.format(
            "frame_index must be 0..{} once each; found min {} max {}",
            L - 1,
            pl.col("fi_min"),
            pl.col("fi_max"),
        ),
    )
    index_ok = (
        (pl.col("index_min") == frm)
        & (pl.col("index_max") == pl.col("dataset_to_index") - 1)
        & (pl.col("index_sum") == Lf * frm.cast(pl.Float64) + Lf * (Lf - 1) / 2)
        & (~fi_ok | ((pl.col("offset_min") == frm) & (pl.col("offset_max") == frm)))
    ).fill_null(False)
    out += _finding_rows(
        df,
        "data.index",
        ~index_ok,
        pl.format(
            "index must run {}..{} contiguously (index - frame_index constant); found {}..{}",
            frm,
            pl.col("dataset_to_index") - 1,
            pl.col("index_min"),
            pl.col("index_max"),
        ),
    )
    return fi_ok, index_ok, out


def _task_findings(raw: RawRoot, df: pl.DataFrame) -> list[Finding]:
    """``data.task_index``: the data's task_index is the episode's, and a known task."""
    valid = raw.tasks["task_index"].to_pylist() if raw.tasks is not None else []
    # An episode may hold several tasks (its `tasks` list): the data's values lie within them.
    task_ok = (
        (pl.col("task_min") >= pl.col("task_lo"))
        & (pl.col("task_max") <= pl.col("task_hi"))
        & (pl.col("task_lo") >= 0)
        & pl.col("task_min").is_in(valid)
        & pl.col("task_max").is_in(valid)
    ).fill_null(False)
    return _finding_rows(
        df,
        "data.task_index",
        ~task_ok,
        pl.format(
            "task_index in the data is {}..{} but the episode's tasks are {}..{}",
            pl.col("task_min"),
            pl.col("task_max"),
            pl.col("task_lo"),
            pl.col("task_hi"),
        ),
    )


def _value_findings(df: pl.DataFrame) -> list[Finding]:
    """Per-column counters of the scan: nulls, NaN/inf, shapes, image bytes."""
    out: list[Finding] = []
    for prefix, check, noun, what in (
        ("nulls:", "data.nulls", "null value", ""),
        ("elem_nulls:", "data.nulls", "row", " with null elements"),
        ("nonfinite:", "data.nan", "row", " with NaN/inf"),
        ("shape:", "data.shape", "row", " whose list length differs from the declared shape"),
        ("image:", "data.image", "image", " whose bytes are not PNG/JPEG/WebP/GIF/BMP/TIFF"),
    ):
        for c in [c for c in df.columns if c.startswith(prefix)]:
            name = c[len(prefix) :]
            nouns = pl.when(pl.col(c) == 1).then(pl.lit(noun)).otherwise(pl.lit(noun + "s"))
            out += _finding_rows(
                df,
                check,
                pl.col(c).fill_null(0) > 0,
                pl.format("{} {}{} in {}", pl.col(c), nouns, pl.lit(what), pl.lit(name)),
            )
    return out


def _order_findings(df: pl.DataFrame, index_ok: pl.Expr) -> list[Finding]:
    """``data.order``: an episode whose rows are out of index order inside its file, or placed
    elsewhere in the file than its index says (e.g. episode 3's rows before episode 2's with
    their indices kept). A file holds one contiguous index range (the loader relies on it), so
    index - row number must equal the file's first index on every row; episodes whose index
    range itself is wrong are reported by ``data.index`` instead."""
    if "order_min" not in df.columns or df.height == 0:
        return []
    sound = index_ok.all().over("data_file")  # a file with a wrong index: data.index says it
    df = df.filter(sound)
    ok = (pl.col("order_min") == pl.col("file_first")) & (
        pl.col("order_max") == pl.col("file_first")
    )
    return _finding_rows(
        df,
        "data.order",
        ~ok.fill_null(True),
        pl.format(
            "rows are not in index order in the file (index {}..{}): index - row number "
            "runs {}..{}, expected {} throughout (the file's first index)",
            pl.col("dataset_from_index"),
            pl.col("dataset_to_index") - 1,
            pl.col("order_min"),
            pl.col("order_max"),
            pl.col("file_first"),
        ),
    )


def _timestamp_findings(raw: RawRoot, df: pl.DataFrame) -> list[Finding]:
    """``data.timestamp`` per episode, or one ``info.fps`` finding when every episode's
    timestamps agree on one other fps (info.json's fps is then the likely culprit)."""
    if "ts_err" not in df.columns or df.height == 0:
        return []
    err = df["ts_err"].to_numpy()
    ts_max = df["ts_max"].to_numpy()
    bad = ~(err <= timestamp_tolerance(ts_max))
    df = df.with_columns(pl.Series("ts_bad", bad))
    long = (df["fi_max"].to_numpy() > 0) & (ts_max > 0)
    if bad.any() and long.sum() >= 2 and bad[long].all():
        implied = df["fi_max"].to_numpy()[long] / ts_max[long]
        med = float(np.median(implied))
        if np.all(np.abs(implied - med) <= 1e-3 * med):
            return [
                Finding(
                    "info.fps",
                    ERROR,
                    f"fps is {raw.info.get('fps')} but every episode's timestamps imply "
                    f"{med:.4g} fps",
                    "meta/info.json",
                )
            ]
    return _finding_rows(
        df,
        "data.timestamp",
        pl.col("ts_bad"),
        pl.format(
            "timestamp differs from frame_index / fps by up to {} s", pl.col("ts_err").round(6)
        ),
    )
