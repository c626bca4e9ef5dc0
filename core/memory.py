"""Give freed memory back to the OS between the phases of a long job.

Reading thousands of parquet footers (a v2.x root has one file per episode) or decoding row
groups leaves freed blocks in the allocators (glibc's arenas for the footers' thrift objects,
Arrow's mimalloc/jemalloc pool for column data): the process's RSS then stays at its high-water
mark although nothing is held. A job that promises bounded memory calls :func:`release_memory`
after such a phase.
"""

from __future__ import annotations

import ctypes
import gc


def release_memory() -> None:
    """Collect garbage, ask Arrow's pool to return unused memory and glibc to trim its heap
    (a no-op where either is unavailable)."""
    gc.collect()
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except (ImportError, AttributeError):
        pass
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
