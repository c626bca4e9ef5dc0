"""The signal rules of a command run (core/interrupt.py), in process: a signal the body swallows
still makes the run 128 + signal, SIGTERM is 143, a deferred section raises it when it ends, and
the handlers of the process are given back afterwards. (The CLI as a user meets it:
tests/app/test_signals.py.)"""

from __future__ import annotations

import os
import signal
import time

from episodekit.core import interrupt


def _signal_self(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(1)  # the handler runs here, at the latest
    raise AssertionError("the signal was not raised")


def test_a_swallowed_interrupt_still_exits_130():
    def body() -> int:
        try:
            _signal_self(signal.SIGINT)
        except KeyboardInterrupt as exc:  # what duckdb does: an ordinary error, and go on
            converted = RuntimeError("Query interrupted")
            assert isinstance(exc, interrupt.Interrupted)
        try:
            raise converted
        except Exception:
            pass  # "an unreadable file": reported, the run goes on
        return 0

    assert interrupt.run_command(body) == 130


def test_check_raises_it_again_in_a_broad_except():
    def body() -> int:
        try:
            try:
                _signal_self(signal.SIGINT)
            except KeyboardInterrupt:
                raise RuntimeError("Query interrupted") from None
        except Exception:
            interrupt.check()
            raise AssertionError("check() did not raise") from None
        return 0

    assert interrupt.run_command(body) == 130


def test_sigterm_is_143():
    def body() -> int:
        _signal_self(signal.SIGTERM)
        return 0

    assert interrupt.run_command(body) == 143


def test_a_deferred_section_raises_when_it_ends():
    done = []

    def body() -> int:
        with interrupt.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the handler runs here and defers
            done.append("section finished")
        raise AssertionError("the deferred signal was not raised")

    assert interrupt.run_command(body) == 130
    assert done == ["section finished"]


def test_handlers_are_given_back_and_nothing_is_left_to_raise():
    before = {s: signal.getsignal(s) for s in interrupt.SIGNALS}
    assert interrupt.run_command(lambda: 0) == 0
    assert interrupt.run_command(lambda: _signal_self(signal.SIGINT)) == 130
    assert {s: signal.getsignal(s) for s in interrupt.SIGNALS} == before
    interrupt.check()  # the run is over: nothing is raised in this process any more


def test_a_signal_inside_a_finalizer_is_raised_after_it(capsys):
    """A temporary folder removed by the garbage collector (``weakref.finalize``) when Ctrl-C
    arrives: Python would print the exception as "Exception ignored ... Traceback" and go on
    (the hostile repair test caught one); the signal is raised once the finalizer is done."""
    import weakref

    done = []

    class Spill:
        pass

    def clean_up() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handler runs here, inside the finalizer, and defers
        done.append("finalizer finished")

    def body() -> int:
        spill = Spill()
        weakref.finalize(spill, clean_up)
        del spill  # the finalizer runs now
        time.sleep(1)  # the deferred signal is sent again and raised here
        raise AssertionError("the deferred signal was not raised")

    assert interrupt.run_command(body) == 130
    assert done == ["finalizer finished"]
    assert "Traceback" not in capsys.readouterr().err
