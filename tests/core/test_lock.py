"""The writer lock's clean-up of a failed first write: only a folder holding nothing but our lock
file goes; anything else in it keeps it."""

from __future__ import annotations

from episodekit.core.lock import LOCK_NAME, remove_if_only_lock, writer_lock


def test_a_folder_with_only_our_lock_is_removed(tmp_path):
    out = tmp_path / "out"
    with writer_lock(out):
        assert (out / LOCK_NAME).exists()
    remove_if_only_lock(out)
    assert not out.exists()


def test_a_folder_with_anything_else_is_kept(tmp_path):
    out = tmp_path / "out"
    with writer_lock(out):
        (out / "user.txt").write_text("mine")
    remove_if_only_lock(out)
    assert (out / "user.txt").read_text() == "mine"


def test_an_empty_or_absent_folder_is_fine(tmp_path):
    (tmp_path / "empty").mkdir()
    remove_if_only_lock(tmp_path / "empty")
    remove_if_only_lock(tmp_path / "absent")
    assert not (tmp_path / "empty").exists()
