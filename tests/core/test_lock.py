"""The writer lock: a file next to the folder it guards (never inside it, and never the reason a
folder exists), deleted by its holder, one holder at a time across processes; and the clean-up
of a folder an older version left holding nothing but its lock file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from episodekit.core.lock import LOCK_NAME, lock_path, remove_if_only_lock, writer_lock

HOLD = """
import sys, time
from episodekit.core.lock import writer_lock
with writer_lock(sys.argv[1]):
    print("HELD", flush=True)
    time.sleep(600)
"""

COUNT = """
import sys
from episodekit.core.lock import writer_lock
folder, counter, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for _ in range(n):
    with writer_lock(folder, say=lambda m: None):
        value = int(open(counter).read())
        open(counter, "w").write(str(value + 1))
"""


def test_the_lock_lives_next_to_the_folder_and_goes_with_its_holder(tmp_path):
    out = tmp_path / "out"
    with writer_lock(out):
        assert not out.exists()  # a new --out is not made by its lock
        assert lock_path(out) == tmp_path / ".out.episodekit.lock" and lock_path(out).is_file()
    assert os.listdir(tmp_path) == []
    out.mkdir()
    with writer_lock(out):
        assert os.listdir(out) == []  # nothing inside the folder it guards
    assert os.listdir(tmp_path) == ["out"]


def test_a_symlinked_folder_is_locked_by_its_real_path(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with writer_lock(tmp_path / "link"):
        assert (tmp_path / ".real.episodekit.lock").is_file()
        with writer_lock(tmp_path / "real"):  # the same lock: re-entrant
            pass
    assert sorted(os.listdir(tmp_path)) == ["link", "real"]


def test_a_parent_that_cannot_hold_the_lock_file_puts_it_inside(tmp_path):
    out = tmp_path / ("x" * 240)  # too long a name for a sibling ".<name>.episodekit.lock"
    out.mkdir()
    with writer_lock(out):
        assert (out / LOCK_NAME).is_file()
    assert sorted(os.listdir(tmp_path)) == [out.name] and os.listdir(out) == []


def test_one_holder_at_a_time_across_processes(tmp_path):
    """Four processes increment a counter 40 times each under the lock (read, then write): no
    increment is lost, although every holder deletes the lock file it held."""
    folder, counter = tmp_path / "root", tmp_path / "counter"
    folder.mkdir()
    counter.write_text("0")
    args = [str(folder), str(counter), "40"]
    procs = [subprocess.Popen([sys.executable, "-c", COUNT, *args]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert counter.read_text() == "160"
    assert sorted(os.listdir(tmp_path)) == ["counter", "root"]


def test_a_killed_holder_leaves_only_the_lock_file_which_the_next_writer_removes(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == b"HELD"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    holder.stdout.close()
    assert os.listdir(tmp_path) == [".out.episodekit.lock"]  # no folder: only the lock file
    with writer_lock(out):  # released by the OS: taken at once
        pass
    assert os.listdir(tmp_path) == []


def test_a_folder_with_only_an_old_lock_file_is_removed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text("")  # as an older version left it
    remove_if_only_lock(out)
    assert not out.exists()


def test_a_folder_with_anything_else_is_kept(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text("")
    (out / "user.txt").write_text("mine")
    remove_if_only_lock(out)
    assert (out / "user.txt").read_text() == "mine"


def test_an_empty_or_absent_folder_is_fine(tmp_path):
    (tmp_path / "empty").mkdir()
    remove_if_only_lock(tmp_path / "empty")
    remove_if_only_lock(tmp_path / "absent")
    assert not (tmp_path / "empty").exists()


def test_remove_unheld_lock_never_removes_a_held_lock(tmp_path):
    import subprocess
    import sys

    from episodekit.core.lock import lock_path, remove_unheld_lock

    folder = tmp_path / "gone"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from episodekit.core.lock import writer_lock\n"
         "with writer_lock(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()",
         str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not remove_unheld_lock(folder) and lock_path(folder).is_file()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert not lock_path(folder).exists()  # its holder deleted it
    lock_path(folder).write_text("")  # a killed holder's
    assert remove_unheld_lock(folder) and not lock_path(folder).exists()
    assert not remove_unheld_lock(folder)  # none
