"""SIGINT and SIGTERM stop a command the same way: it unwinds (every ``finally`` runs, every
temporary is removed, worker pools are stopped) and exits 128 + the signal: 130 for Ctrl-C, 143
for SIGTERM. A second signal while it unwinds ends the process at once with the same code (what
is left is temporaries, which the next run removes under the writer lock).

Python raises ``KeyboardInterrupt`` wherever the main thread is when SIGINT arrives, and some
libraries replace it on the way: duckdb turns it into ``RuntimeError("Query interrupted")``, an
``Exception`` that code reporting "one unreadable file" and going on would swallow. So the
handler also remembers the signal: :func:`check` raises it again wherever a broad ``except``
may have caught a converted interrupt, and :func:`run_command` returns 128 + signal for any run
that received one, whatever exception (or none) ended it. A signal that arrives while a
native extension module initialises is raised when that import is done (an exception raised
into it, duckdb's for one, aborts the process: exit -6).

Outside a run, in the ``episodekit`` program (:func:`take_over`: from the first import of the
CLI, before the seconds its imports can take, and after the exit code is decided, while the
interpreter shuts down) a signal ends the process at once with 128 + signal: nothing is being
written then, and a ``KeyboardInterrupt`` there would escape every handler (exit -2 and a
traceback).

Light on purpose: the CLI imports it first thing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from importlib.machinery import ExtensionFileLoader
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)
RESEND_S = 0.05  # a signal deferred by a native import is raised this long after it, at most

_received: int | None = None  # the first signal of the current run (None: none yet)
_running = False  # a run is under way: the first signal raises, it does not exit at once
_program = False  # this process is the episodekit program: the handlers stay until it exits
_deferred = False  # the signal arrived in a native import or a deferred() section: raised later
_held = 0  # deferred() sections under way
_at_end: list[Callable[[], None]] = []  # clean-ups run when a command ends (at_end)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived (a ``KeyboardInterrupt``, so code that expects Ctrl-C sees it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def message(signum: int) -> str:
    """The one line a command interrupted by ``signum`` prints on stderr."""
    return "Error: interrupted" + (
        "" if signum == signal.SIGINT else f" ({signal.Signals(signum).name})"
    )


def _exit_now(signum: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):
        os.write(2, f"\n{message(signum)}\n".encode())
    os._exit(128 + signum)


def _handler(signum: int, frame: FrameType | None) -> None:
    global _received, _deferred
    if not _running or (_received is not None and not _deferred):  # none of a run's, or a 2nd
        _exit_now(_received or signum)
    _received = signum
    if _held or in_native_import(frame) or in_finalizer(frame):  # (see those two)
        start = not _deferred and not _held
        _deferred = True  # before the thread starts: it resends while this is set
        if start:
            threading.Thread(target=_resend, args=(signum,), daemon=True).start()
        return
    _deferred = False
    raise Interrupted(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A section a signal must not cut: one that arrives inside is raised when it ends.
    (Starting pool workers: a worker whose parent stops while it sends the worker its start-up
    data dies with a traceback on the caller's stderr.)"""
    global _held, _deferred
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        pending = not _held and _deferred and _received is not None
        if pending:
            _deferred = False
    if pending:  # (the section raised: its exception goes on, and the run maps to 128 + signal)
        raise Interrupted(_received)


def in_native_import(frame: FrameType | None) -> bool:
    """True when ``frame`` runs inside the initialisation of a native extension module (duckdb,
    pyarrow, numpy: an ``ExtensionFileLoader`` is on the stack), where an exception raised from
    a signal handler aborts the process. A pure-Python import fails cleanly and may be cut."""
    while frame is not None:
        code = frame.f_code
        if code.co_name in ("create_module", "exec_module") and code.co_filename.startswith(
            "<frozen importlib"
        ):
            if isinstance(frame.f_locals.get("self"), ExtensionFileLoader):
                return True
        frame = frame.f_back
    return False


def in_finalizer(frame: FrameType | None) -> bool:
    """True when ``frame`` runs inside a ``weakref.finalize`` callback (a temporary folder's
    clean-up run by the garbage collector) or a ``__del__``: Python prints an exception raised
    there as "Exception ignored ... Traceback" and goes on, so the signal is raised after it."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (
            code.co_name == "__call__" and code.co_filename.endswith("weakref.py")
        ):
            return True
        frame = frame.f_back
    return False


def _resend(signum: int) -> None:
    """Send ``signum`` again every ``RESEND_S`` until the handler could raise it (the native
    import under way when it first arrived is done)."""
    while _deferred:
        time.sleep(RESEND_S)
        if _deferred:
            os.kill(os.getpid(), signum)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def take_over() -> None:
    """In the ``episodekit`` program only: handle SIGINT and SIGTERM from now until the process
    exits (the module docstring says how). Elsewhere (a test importing the CLI) a no-op, and
    :func:`run_command` installs the handlers for its run only."""
    global _program
    argv = list(getattr(sys, "orig_argv", sys.argv))
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    if not _on_main_thread() or not (module.startswith("episodekit") or script == "episodekit"):
        return
    _program = True
    for s in SIGNALS:
        signal.signal(s, _handler)


def reinstall() -> None:
    """Take SIGINT and SIGTERM back after a library set its own handlers (``ray.init`` makes
    SIGTERM a plain ``sys.exit``); a no-op unless ours were installed."""
    if _on_main_thread() and any(signal.getsignal(s) is _handler for s in SIGNALS):
        for s in SIGNALS:
            signal.signal(s, _handler)


def at_end(fn: Callable[[], None]) -> None:
    """Have :func:`run_command` call ``fn`` when a command ends, however it ends: for what only
    the process knows is its own (a staging folder made just before a signal, whose caller had
    no chance to discard it: :func:`episodekit.core.staging.discard_unfinished`)."""
    if fn not in _at_end:
        _at_end.append(fn)


def _run_at_end() -> None:
    for fn in _at_end:
        with contextlib.suppress(Exception):
            fn()


def run_command(body: Callable[[], int | None]) -> int:
    """Run ``body`` (a command: its exit code, or None when it was interrupted) with SIGINT and
    SIGTERM handled as the module docstring says; its exit code, or 128 + signal when a signal
    arrived during the run. Off the main thread, ``body`` runs as it is."""
    global _received, _running, _deferred
    if not _on_main_thread():
        try:
            code = body()
        finally:
            _run_at_end()
        return 128 + signal.SIGINT if code is None else code
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, _handler)
    _received = None
    try:
        try:
            _running = True  # from here the first signal raises Interrupted ...
            code = body()
            _running = _deferred = False  # ... and from here it exits at once
        except KeyboardInterrupt:
            _running = _deferred = False
            code = None
    finally:
        _run_at_end()  # (a signal now ends the process at once: the next run cleans up)
        if not _program:
            for s, handler in previous.items():
                signal.signal(s, handler)
    sig, _received = _received, None  # (a later check() in this process has nothing to raise)
    if code is None or sig is not None:
        return 128 + (sig or signal.SIGINT)
    return code


def check() -> None:
    """Raise :class:`Interrupted` again if a signal arrived: for ``except`` clauses broad enough
    to have caught an interrupt that a library turned into an ordinary exception."""
    global _deferred
    if _received is not None:
        _deferred = False
        raise Interrupted(_received)
