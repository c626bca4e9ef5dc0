"""``repair --in-place``'s way back: the backup folder, its manifest with content hashes, the
one step that replaces ROOT's files, and :func:`restore`.

A backup is made whole (manifest included) before the first file of ROOT changes
(:func:`~episodekit.core.staging.new_backup`); the manifest lists the files the repair
replaces, creates and removes, with the sha256 of each before and after. :func:`commit`
replaces the files in one deferred section (a signal is raised once ROOT is fully repaired);
an error half-way puts ROOT back. :func:`restore` decides file by file from the hashes what
putting ROOT back takes (so a backup a ``kill -9`` left half-made, or a restore killed
half-way, is finished correctly), refuses to overwrite or delete a file changed since the
repair, and refuses any manifest path that could leave ROOT (absolute, ``..``, a symlink on
the way). Every change to the disk is a crash point (:mod:`episodekit.core.crashpoint`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from episodekit.core import crashpoint, interrupt, staging
from episodekit.core.atomic import atomic_write_text
from episodekit.core.errors import EnvironmentProblem, os_problem
from episodekit.core.lock import writer_lock
from episodekit.writers import repair_build

MANIFEST = "manifest.json"
BACKUP_FORMAT = 2  # the backup's manifest: with content hashes (format 1 had none)


def manifest_of(root: Path, work: Path, staged: repair_build.Staged) -> dict:
    """What the backup records: the files the repair replaces, creates and removes, and the
    content hash of each before (the originals) and after (the new files), so that a restore
    puts back only over files nobody changed since."""
    replaced = [rel for rel in staged.written if os.path.lexists(root / rel)]
    return {
        "format": BACKUP_FORMAT,
        "root": str(root),
        "replaced": replaced,
        "created": [rel for rel in staged.written if rel not in replaced],
        "removed": list(staged.removed),
        "before": {rel: _digest(root / rel) for rel in [*replaced, *staged.removed]},
        "after": {rel: _digest(work / rel) for rel in staged.written},
        "complete": False,
    }


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def commit(
    root: Path, work: Path, staged: repair_build.Staged, manifest: dict, result: Any
) -> None:
    """Replace ROOT's files by the staged ones, each kept in a new backup folder first
    (``result.backup`` names it once ROOT is fully repaired). One deferred section: a signal
    during it is raised once ROOT is fully repaired; an error puts ROOT back as it was and
    removes the backup. The backup exists, with its manifest, before the first file of ROOT
    changes (:func:`~episodekit.core.staging.new_backup`): a ``kill -9`` at any moment leaves
    ROOT as it was, fully repaired, or restorable from it."""
    backup = None
    try:
        with interrupt.deferred():
            text = json.dumps(manifest, indent=2)
            backup = staging.new_backup(root, {MANIFEST: text})
            files = backup / "files"
            for rel in manifest["replaced"]:  # kept first (a link), then replaced atomically
                crashpoint.reached("in-place: keep a replaced file")
                repair_build.link_or_copy(root / rel, files / rel)
            for rel in staged.written:
                crashpoint.reached("in-place: replace")
                _move(work / rel, root / rel)
            for rel in manifest["removed"]:
                crashpoint.reached("in-place: remove")
                _move(root / rel, files / rel)
            manifest["complete"] = True
            crashpoint.reached("in-place: complete the manifest")
            _write_manifest(backup, manifest)
            result.backup = str(backup)
    except BaseException as exc:
        if backup is None or result.backup:
            raise  # nothing changed yet, or ROOT repaired (a signal held until the end)
        try:  # an error (or, outside the CLI, a KeyboardInterrupt) half-way: ROOT put back
            with interrupt.deferred():
                _undo(root, backup, _restore_plan(root, backup, manifest))
            staging.retire_backup(backup, root)
        except Exception:
            raise EnvironmentProblem(
                f"could not repair in place ({exc}) nor put every file back; {backup} holds "
                f"the originals ({undo_hint(root, backup)})",
                str(root),
            ) from exc
        raise


def undo_hint(root: str | os.PathLike, backup: str | os.PathLike) -> str:
    """How to undo an ``--in-place`` repair of ``root`` (named wherever the backup is)."""
    return f"undo: episodekit repair {root} --restore {backup}"


def backup_note(root: str | os.PathLike, backup: str | os.PathLike) -> str:
    """The line a run that repaired ROOT in place and then stopped (a signal, an error) prints
    on stderr, so that the backup is named on every way out."""
    return (
        f"{root} was repaired in place before the run stopped; the files it replaced or "
        f"removed are in {backup} ({undo_hint(root, backup)})"
    )


def _write_manifest(backup: Path, manifest: dict) -> None:
    atomic_write_text(backup / MANIFEST, json.dumps(manifest, indent=2))


def _move(src: Path, dst: Path) -> None:
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
    except OSError as exc:
        raise os_problem(exc, src, "move") from exc


def unfinished(root: str | os.PathLike) -> Path | None:
    """A backup of ROOT whose repair was killed while it replaced files (its manifest is not
    complete, its writer gone): ROOT may be half repaired until it is restored."""
    real = Path(os.path.realpath(root))
    for b in staging.backups(real):
        try:
            doc = json.loads((b / MANIFEST).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("complete") is False and staging.writer_gone(b):
            return b
    return None


def refuse_unfinished(root: str | os.PathLike) -> None:
    b = unfinished(root)
    if b is not None:
        raise EnvironmentProblem(
            f"an in-place repair of it was killed while it replaced files, {b} holds what it "
            f"had replaced: put it back first ({undo_hint(root, b)})",
            str(root),
        )


def restore(backup: str | os.PathLike, expect_root: str | os.PathLike | None = None) -> str:
    """Put an ``--in-place`` repair's backup back: the root is again what it was before it
    (files it created removed, files it replaced or removed moved back); the backup folder is
    removed. Only over files nobody changed since the repair (the manifest's content hashes):
    otherwise it refuses, naming them, and changes nothing. A backup a killed repair left
    half-made puts back what was replaced (the hashes tell which files were). Every path of
    the manifest must lie inside ROOT (and inside the backup): relative, no ``..``, no
    symlink on the way. ``expect_root``: refuse a backup of another root. Returns the root."""
    folder = Path(os.path.abspath(backup))
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        root = Path(manifest["root"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EnvironmentProblem(f"not a repair backup ({exc})", str(backup)) from exc
    named = folder.parent / root.name
    if not staging.is_backup(folder, named) or os.path.realpath(named) != str(root):
        raise EnvironmentProblem(
            f"not a repair backup of {root} (not named and marked as one, next to it)",
            str(backup),
        )
    if expect_root is not None and os.path.realpath(expect_root) != str(root):
        raise EnvironmentProblem(f"a backup of {root}, not of {expect_root}", str(backup))
    _check_manifest(manifest, backup)
    if not root.is_dir():
        raise EnvironmentProblem(f"{root}, the root it was made from, is gone", str(backup))
    with writer_lock(root):
        staging.remove_stale(root)  # a killed run's folders
        plan = _restore_plan(root, folder, manifest)
        with interrupt.deferred():  # a signal cannot leave ROOT half restored (nor the
            _undo(root, folder, plan)  # backup of a root restored already)
            staging.retire_backup(folder, root)
    return str(root)


def _check_manifest(manifest: dict, backup: str | os.PathLike) -> None:
    """Refuse a manifest this version cannot trust: no content hashes (an older version's), a
    list or a hash of the wrong kind, or a path that could leave the root (absolute, ``..``,
    empty or ``.`` parts)."""
    what = "not a repair backup"
    if manifest.get("format") != BACKUP_FORMAT:
        raise EnvironmentProblem(
            f"a backup without content hashes (format {manifest.get('format')!r}, an older "
            f"episodekit's): restore it by hand from its files/ folder",
            str(backup),
        )
    lists = [manifest.get(k) for k in ("replaced", "created", "removed")]
    hashes = [manifest.get(k) for k in ("before", "after")]
    if not all(isinstance(x, list) for x in lists) or not all(isinstance(h, dict) for h in hashes):
        raise EnvironmentProblem(f"{what} (its manifest lists no files)", str(backup))
    replaced, created, removed = lists
    before, after = hashes
    for rel in [*replaced, *created, *removed]:
        if not _relative(rel):
            raise EnvironmentProblem(
                f"refusing a backup whose manifest names {rel!r}: not a path inside the root",
                str(backup),
            )
    need = [(rel, before) for rel in [*replaced, *removed]] + [
        (rel, after) for rel in [*replaced, *created]
    ]
    for rel, table in need:
        digest = table.get(rel)
        if not (isinstance(digest, str) and len(digest) == 64):
            raise EnvironmentProblem(f"{what} (its manifest has no hash of {rel})", str(backup))


def _relative(rel: object) -> bool:
    """Whether ``rel`` is a plain relative path: parts neither empty, ``.`` nor ``..``."""
    if not isinstance(rel, str) or not rel or "\0" in rel or rel.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def _no_link_on_the_way(base: Path, rel: str) -> bool:
    """Whether ``base/rel`` goes through no symlink below ``base`` (nor is one): it names a
    file inside ``base``, whatever links a user put there."""
    p = base
    for part in rel.split("/"):
        p = p / part
        if p.is_symlink():
            return False
        if not p.exists():
            return True  # (nothing further down exists either)
    return True


def _state(base: Path, rel: str) -> str | None:
    """The content hash of ``base/rel``, None when absent; ``"link"`` when it or a folder on
    the way is a symlink (never followed)."""
    if not _no_link_on_the_way(base, rel):
        return "link"
    p = base / rel
    if not p.exists():
        return None
    if not p.is_file():
        return "not a file"
    return _digest(p)


def _restore_plan(root: Path, backup: Path, manifest: dict) -> list[tuple[str, str]]:
    """What putting ROOT back takes, file by file, from the content hashes: ``("back", rel)``
    moves the backup's original to ROOT, ``("delete", rel)`` removes a file the repair
    created; a file already as it was needs nothing. Raises (nothing changed) naming every
    file changed since the repair: a restore never overwrites nor deletes one."""
    files = backup / "files"
    before, after = manifest["before"], manifest["after"]
    plan: list[tuple[str, str]] = []
    changed: list[str] = []
    lost: list[str] = []
    for rel in manifest["replaced"]:
        now, kept = _state(root, rel), _state(files, rel)
        if now == before[rel]:
            continue  # never replaced (a half-made backup), or already put back
        if now != after[rel]:
            changed.append(rel)
        elif kept != before[rel]:
            lost.append(rel)
        else:
            plan.append(("back", rel))
    for rel in manifest["created"]:
        now = _state(root, rel)
        if now is None:
            continue
        if now != after[rel]:
            changed.append(rel)
        else:
            plan.append(("delete", rel))
    for rel in manifest["removed"]:
        now, kept = _state(root, rel), _state(files, rel)
        if now == before[rel]:
            continue  # never removed, or already put back
        if now is not None:
            changed.append(rel)
        elif kept != before[rel]:
            lost.append(rel)
        else:
            plan.append(("back", rel))
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if changed[5:] else "")
        raise EnvironmentProblem(
            f"not restored: {shown} changed since the repair (a restore would lose that); "
            "nothing was changed",
            str(root),
        )
    if lost:
        raise EnvironmentProblem(
            f"not restored: the backup's copy of {lost[0]} is missing or changed; "
            "nothing was changed",
            str(backup),
        )
    return plan


def _undo(root: Path, backup: Path, plan: list[tuple[str, str]]) -> None:
    """Carry out a :func:`_restore_plan`."""
    for op, rel in plan:
        crashpoint.reached(f"restore: {op}")
        if op == "delete":
            (root / rel).unlink(missing_ok=True)
        else:
            _move(backup / "files" / rel, root / rel)
