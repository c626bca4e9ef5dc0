"""How ``make_loader``'s worker processes are started, and what is said when one dies.

- :func:`choose_start_method`: 'spawn' (a clean interpreter per worker: nothing of the training
  process's threads, CUDA or open files) whenever it can start workers from the current call;
  when it cannot (a script read from stdin, or a call at a script's top level outside
  ``if __name__ == "__main__":``, which each worker would run again) 'fork' on Linux when it is
  safe (CUDA not initialized: torch's own rule), so such scripts work wherever
  ``torch.utils.data.DataLoader`` works; else one line naming what to add. An explicit
  ``start_method`` is used as given.
- :class:`StderrRelay`: each worker's stderr goes through a pipe that the training process
  relays to its own stderr as it comes (nothing is hidden), keeping the last lines, so that a
  dead worker's error quotes what it said (:func:`died`): its exit code or signal and its last
  stderr line, never a guess.
"""

from __future__ import annotations

import ast
import multiprocessing as mp
import os
import re
import signal
import sys
import threading
from collections import deque
from typing import Any

TAIL_LINES = 40
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b.*:")
SPAWN_RERUN = ("bootstrapping phase", "freeze_support")


def fork_is_safe() -> bool:
    """Whether forking this process is safe: not once CUDA is initialized (a forked child
    cannot use it, and the driver's threads are not copied), which is torch's rule too."""
    torch = sys.modules.get("torch")
    if torch is None:
        return True
    try:
        return not torch.cuda.is_initialized()
    except Exception:  # pragma: no cover - a broken torch install: do not fork
        return False


def choose_start_method(requested: str | None = None) -> str:
    """``requested`` when given (checked); else 'spawn' (a clean interpreter per worker) when it
    can start workers from here, and 'fork' (Linux, when :func:`fork_is_safe`) when 'spawn'
    would run the caller's script again (:func:`spawn_blocker`); else a ValueError in one line
    naming what to add."""
    methods = mp.get_all_start_methods()
    if requested is not None:
        if requested not in methods:
            raise ValueError(f"start_method must be one of {', '.join(methods)}, got {requested!r}")
        return requested
    blocker = spawn_blocker()
    if blocker is None:
        return "spawn"
    if sys.platform.startswith("linux") and "fork" in methods and fork_is_safe():
        return "fork"
    fix = (
        "save it to a file"
        if "stdin" in blocker
        else 'put the script\'s top level under `if __name__ == "__main__":`'
    )
    raise ValueError(
        f"make_loader cannot start its workers here: {blocker}, so 'spawn' would run it again "
        f"in each worker, and 'fork' is not safe in this process (CUDA is initialized): {fix}"
    )


def spawn_blocker() -> str | None:
    """Why 'spawn' cannot start workers from the current call, or None when it can: the main
    script is read from stdin (a worker cannot run it again), or this call runs at its top level
    outside ``if __name__ == "__main__":`` (each worker would run it again)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None:  # an interactive session, a notebook: nothing re-runs
        return None
    if not os.path.isfile(path):
        return "the script is read from stdin" if "stdin" in str(path) else f"{path} is no file"
    frame, line = sys._getframe(), None
    while frame is not None:
        if frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>":
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:  # called from no top-level code of the script (a thread, a callback)
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_guard(node.test):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                return None
    return (
        f'{os.path.basename(path)} calls it at its top level, outside `if __name__ == "__main__":`'
    )


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either side)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    sides = [test.left, *test.comparators]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return isinstance(test.ops[0], ast.Eq) and names == ["__name__"] and values == ["__main__"]


class StderrRelay:
    """A worker's stderr: relayed to ours as it comes, its last lines kept."""

    def __init__(self, fd: int, out: int):
        self.fd, self.out = fd, out
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial = b""
        self._thread: threading.Thread | None = None
        self._done = threading.Event()

    @classmethod
    def start(cls, proc: Any) -> StderrRelay:
        """Start ``proc`` with its stderr (fd 2) on a new pipe; the relay reads the other end.
        (fd 2 is ours again as soon as the process is started.)"""
        r, w = os.pipe()
        out = os.dup(2)
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(w, 2)
        try:
            proc.start()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(w)
        return cls(r, out)

    def run_in_thread(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="episodekit-stderr")
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                data = os.read(self.fd, 65536)
                if not data:
                    break
                try:
                    os.write(self.out, data)
                except OSError:  # our stderr is gone: keep the lines anyway
                    pass
                lines = (self._partial + data).split(b"\n")
                self._partial = lines.pop()
                self.tail.extend(x.decode(errors="replace").rstrip() for x in lines)
        except OSError:  # pragma: no cover - the pipe was closed under us
            pass
        finally:
            if self._partial:
                self.tail.append(self._partial.decode(errors="replace").rstrip())
            for fd in (self.fd, self.out):
                try:
                    os.close(fd)
                except OSError:  # pragma: no cover
                    pass
            self._done.set()

    def drain(self, timeout: float = 1.0) -> None:
        """Wait (at most ``timeout``) until the worker's stderr is read to its end."""
        if self._thread is not None:
            self._done.wait(timeout)

    def stop(self) -> None:
        self.drain(1.0)

    def last_line(self) -> str:
        """The last exception line it wrote (``Type: message``, with the message's first line
        when it starts on the next one), else its last non-empty line, else ''."""
        lines = [x for x in self.tail if x.strip()]
        for i in range(len(lines) - 1, -1, -1):
            if EXCEPTION_LINE.match(lines[i].strip()):
                text = lines[i].strip()
                if text.endswith(":") and i + 1 < len(lines):
                    text = f"{text} {lines[i + 1].strip()}"
                return text
        return lines[-1].strip() if lines else ""

    def mentions(self, *words: str) -> bool:
        return any(w in line for line in self.tail for w in words)


def died(w: int, proc: Any, relay: StderrRelay | None, start_method: str) -> str:
    """One line: worker ``w`` died, how (exit code or signal), its last stderr line, and the fix
    when it is the one 'spawn' needs (a script that runs again in each worker)."""
    if relay is not None:
        relay.drain(1.0)
    code = proc.exitcode
    if code is None:
        how = "stopped answering"
    elif code < 0:
        try:
            how = f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exit code {code}"
    msg = f"loader worker {w} (pid {proc.pid}) died ({how})"
    last = relay.last_line() if relay is not None else ""
    msg += f"; its last stderr line: {last}" if last else "; it wrote nothing on stderr"
    if start_method != "spawn" or relay is None:
        return msg
    if relay.mentions("<stdin>"):
        msg += (
            "; with start_method='spawn' each worker runs the script again, and a script read "
            "from stdin cannot be: save it to a file (or leave start_method unset on Linux: "
            "'fork')"
        )
    elif relay.mentions(*SPAWN_RERUN):
        msg += (
            "; with start_method='spawn' each worker runs the script again: put its top level "
            "under `if __name__ == \"__main__\":` (or leave start_method unset on Linux: 'fork')"
        )
    return msg
