"""The local process pool's stop: nothing of it outlives the stop, even a half-sent result."""

from __future__ import annotations

import multiprocessing
import os
import struct
from concurrent.futures import ProcessPoolExecutor

from episodekit.core import executor


def test_stop_ends_a_manager_thread_stuck_on_a_half_sent_result():
    """A worker stopped while it sends a result leaves half a message in the result pipe; the
    pool's manager thread then waits for the rest forever and the interpreter, which joins it
    at exit, hangs (``edit`` after Ctrl-C, found by the signal tests). Here the half message is
    written by hand; the stop must still end the thread."""
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    assert pool.submit(os.getpid).result(timeout=60) > 0  # the worker and the thread run
    manager = pool._executor_manager_thread
    writer = pool._result_queue._writer
    os.write(writer.fileno(), struct.pack("!i", 1000) + b"x" * 10)  # 10 of 1000 bytes
    manager.join(timeout=0.5)
    assert manager.is_alive()  # stuck in recv, as after a worker died mid-send
    executor._stop(pool)
    manager.join(timeout=10)
    assert not manager.is_alive()
