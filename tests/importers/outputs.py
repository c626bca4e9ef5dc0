"""What an import wrote, read back the plain way (pyarrow, PyAV) for the import tests; the CLI
as a subprocess is :func:`tests.app.hostile.cli`, PSNR is the writers' own
:func:`episodekit.writers.image_video.psnr_db`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def data(root: Path) -> pa.Table:
    """Every data file of ``root``, in ``index`` order."""
    files = sorted((root / "data").rglob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]).sort_by("index")


def column(t: pa.Table, name: str) -> np.ndarray:
    """A column as numpy: (rows,) or (rows, width) for a fixed-size list."""
    col = t[name].combine_chunks()
    if pa.types.is_fixed_size_list(col.type):
        return col.flatten().to_numpy().reshape(len(col), col.type.list_size)
    return col.to_numpy()


def decoded(path: Path) -> np.ndarray:
    """Every frame of an mp4 as RGB (T, H, W, 3)."""
    import av

    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
