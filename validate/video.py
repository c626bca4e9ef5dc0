"""``video.*`` checks: every camera's mp4 against info.json and the episodes table.

Demux only by default (no frame is decoded, so it stays fast): each referenced mp4 is opened once
and its packets' timestamps and the stream's codec, rate, size and pixel format are compared with
info.json's ``video.*`` fields, and, for every episode of that file, the frames in
``[from_timestamp, to_timestamp)`` are counted against ``length`` and each
``from_timestamp + frame_index / fps`` must land on a frame within ``tolerance_s`` (LeRobot's
rule at load time, where a mismatch surfaces as ``FrameTimestampError``). ``--deep`` decodes every
frame. Missing files are ``info.videos``'s business and are skipped here; without PyAV one
warning says what to install.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from episodekit.core.dataset import V2, is_local
from episodekit.core.mp4_stream import probe_boxes
from episodekit.core.paths import INFO_FILE, UnsafePathError, format_template
from episodekit.core.remote import open_ranged
from episodekit.core.video import (
    INSTALL_HINT,
    VideoError,
    VideoIndex,
    canonical_codec,
    decode_all,
    have_av,
    probe,
)
from episodekit.validate.declared import stream_findings, visual_axes
from episodekit.validate.raw import ERROR, WARNING, Finding, RawRoot

DEFAULT_TOLERANCE_S = 1e-4  # LeRobot's default tolerance_s

# The checks a stream fact decides (not judged when a file's boxes do not settle the fact).
_UNDECIDED_CHECKS = {"codec": ("video.codec",), "pix_fmt": ("video.pix_fmt", "video.channels")}


def video_features(raw: RawRoot) -> dict[str, dict]:
    return {
        k: f for k, f in raw.features.items() if isinstance(f, dict) and f.get("dtype") == "video"
    }


def _segments(raw: RawRoot, key: str) -> tuple[list[tuple[str, np.ndarray]], list[Finding]]:
    """(relative mp4 path, episodes-table rows in it) per file of camera ``key``."""
    e = raw.episodes
    if raw.version in V2:
        template = raw.info.get("video_path")
        chunks = max(1, int(raw.info.get("chunks_size") or 1000))
        ep = e["episode_index"].to_numpy()
        groups = []
        for row, i in enumerate(ep.tolist()):
            try:
                rel = format_template(
                    template, video_key=key, episode_chunk=i // chunks, episode_index=i
                )
            except UnsafePathError as exc:
                return [], [
                    Finding("video.readable", ERROR, f"video_path unusable: {exc}", INFO_FILE)
                ]
            groups.append((rel, np.array([row])))
        return groups, []
    cols = [f"videos/{key}/{c}" for c in ("chunk_index", "file_index")]
    cols += [f"videos/{key}/from_timestamp", f"videos/{key}/to_timestamp"]
    missing = [c for c in cols if c not in e.column_names]
    if missing:
        msg = f"camera {key}: episodes table lacks {', '.join(missing)}"
        return [], [Finding("video.frames", ERROR, msg, "meta/episodes")]
    chunk = e[cols[0]].to_numpy().astype(np.int64)
    fidx = e[cols[1]].to_numpy().astype(np.int64)
    ids, inverse = np.unique(chunk * (1 << 32) + fidx, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(ids) + 1))
    groups = []
    for j, fid in enumerate(ids.tolist()):
        try:
            rel = format_template(
                raw.info.get("video_path"),
                video_key=key,
                chunk_index=fid >> 32,
                file_index=fid & 0xFFFFFFFF,
            )
        except UnsafePathError as exc:
            return [], [Finding("video.readable", ERROR, f"video_path unusable: {exc}", INFO_FILE)]
        groups.append((rel, order[bounds[j] : bounds[j + 1]]))
    return groups, []


@contextlib.contextmanager
def _source(raw: RawRoot, rel: str, ranged: bool = False) -> Iterator[tuple[str, Any]]:
    """(path, open file or None for a local path); ``ranged``: each read one range request."""
    full = raw.join(rel)
    if is_local(raw.fs):
        yield full, None
    else:
        with open_ranged(raw.fs, full) if ranged else raw.fs.open(full, "rb") as fh:
            yield full, fh


def _probe(raw: RawRoot, rel: str, boxes: bool) -> VideoIndex | None:
    """The file's :class:`VideoIndex`: demuxed by PyAV, or with ``boxes`` read from its box
    headers and ``moov`` alone (None: the boxes do not describe it)."""
    with _source(raw, rel, ranged=boxes) as (full, fh):
        return probe_boxes(full, fh) if boxes else probe(full, fh)


def _declared(feature: dict, raw: RawRoot) -> dict[str, Any]:
    info = feature.get("info") or {}
    axes = visual_axes(feature)  # the shape read through its axis names
    return {
        "codec": info.get("video.codec"),
        "fps": info.get("video.fps", raw.fps),
        "height": info.get("video.height", axes["height"]),
        "width": info.get("video.width", axes["width"]),
        "pix_fmt": info.get("video.pix_fmt"),
    }


def _stream_findings(index: VideoIndex, decl: dict, rel: str, first_ep: int) -> list[Finding]:
    out = []
    if decl["codec"] is not None and canonical_codec(decl["codec"]) != index.codec:
        msg = f"codec {index.codec} but info.json video.codec is {decl['codec']!r}"
        out.append(Finding("video.codec", ERROR, msg, rel, first_ep))
    if decl["fps"] is not None and index.fps and abs(float(decl["fps"]) - index.fps) > 1e-3:
        msg = f"stream rate {index.fps:g} fps but info.json says {decl['fps']}"
        out.append(Finding("video.fps", ERROR, msg, rel, first_ep))
    for dim in ("height", "width"):
        want = decl[dim]
        if want is not None and int(want) != getattr(index, dim):
            msg = f"{dim} {getattr(index, dim)} but info.json video.{dim} is {want}"
            out.append(Finding("video.size", ERROR, msg, rel, first_ep))
    if decl["pix_fmt"] is not None and index.pix_fmt != decl["pix_fmt"]:
        msg = f"pix_fmt {index.pix_fmt} but info.json video.pix_fmt is {decl['pix_fmt']!r}"
        out.append(Finding("video.pix_fmt", ERROR, msg, rel, first_ep))
    return out


def episode_findings(
    t: np.ndarray,
    episodes: np.ndarray,
    start: np.ndarray,
    stop: np.ndarray,
    length: np.ndarray,
    fps: float,
    tolerance_s: float,
    rel: str,
) -> list[Finding]:
    """``video.frames`` / ``video.timestamps`` for the episodes of one file (vectorized).

    ``t``: the file's frame times (s, ascending); per episode its window and length. A frame
    belongs to the episode whose window holds it after shifting by half a frame (so a frame
    jittered by less than half a frame still counts where it should).
    """
    out: list[Finding] = []
    half = 0.5 / fps
    counts = np.searchsorted(t, stop - half) - np.searchsorted(t, start - half)
    for i in np.flatnonzero(counts != length).tolist():
        msg = (
            f"{int(counts[i])} frames in [{start[i]:.4f}, {stop[i]:.4f}) s but length is "
            f"{int(length[i])}"
        )
        out.append(Finding("video.frames", ERROR, msg, rel, int(episodes[i])))
    if len(t) == 0 or length.sum() == 0:
        return out
    # Each expected time from + k/fps must have a frame within tolerance (LeRobot's rule).
    rep = np.repeat(np.arange(len(length)), length)
    k = np.arange(len(rep)) - np.repeat(np.cumsum(length) - length, length)
    want = start[rep] + k / fps
    j = np.clip(np.searchsorted(t, want), 1, max(1, len(t) - 1))
    lo, hi = t[np.clip(j - 1, 0, len(t) - 1)], t[np.clip(j, 0, len(t) - 1)]
    dist = np.minimum(np.abs(lo - want), np.abs(hi - want))
    bad = dist > tolerance_s
    if bad.any():
        first = np.full(len(length), -1)
        pos = np.flatnonzero(bad)
        ep_of = rep[pos]
        uniq, first_pos = np.unique(ep_of, return_index=True)
        first[uniq] = pos[first_pos]
        nbad = np.bincount(ep_of, minlength=len(length))
        for i in uniq.tolist():
            p = first[i]
            msg = (
                f"{int(nbad[i])} of {int(length[i])} frames have no video frame within "
                f"tolerance_s={tolerance_s:g} (first: frame_index {int(k[p])} at {want[p]:.4f} s, "
                f"nearest frame {dist[p]:.4f} s away)"
            )
            out.append(Finding("video.timestamps", ERROR, msg, rel, int(episodes[i])))
    a = np.searchsorted(t, start - half)
    b = np.searchsorted(t, stop - half)
    delta = np.zeros(len(t) + 1, dtype=np.int64)
    np.add.at(delta, a, 1)
    np.add.at(delta, b, -1)
    depth = np.cumsum(delta)[:-1]
    covered = depth > 0
    over = np.flatnonzero(depth > 1)
    if over.size:
        ep = int(episodes[np.searchsorted(start, t[over[0]] + half, side="right") - 1])
        msg = f"{over.size} frames belong to two episodes' windows (from {t[over[0]]:.4f} s)"
        out.append(Finding("video.timestamps", ERROR, msg, rel, ep))
    loose = np.flatnonzero(~covered)
    if loose.size:
        last = int(episodes[np.argmax(stop)])
        msg = (
            f"{loose.size} frames lie outside every episode's window (first at {t[loose[0]]:.4f} s)"
        )
        out.append(Finding("video.frames", WARNING, msg, rel, last))
    return out


def _note(notes: list[str] | None, text: str) -> None:
    if notes is not None:
        notes.append(text)


def check_videos(
    raw: RawRoot,
    want: set[str],
    deep: bool = False,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    boxes: bool = False,
    notes: list[str] | None = None,
) -> list[Finding]:
    """All ``video.*`` findings for ``raw`` (only the checks in ``want`` are reported).

    ``boxes``: read each mp4's box headers and ``moov`` only (``--metadata-only``: no frame is
    read, by range requests on a remote root); a file or a fact its boxes do not settle is not
    judged, and a line saying so is added to ``notes``."""
    feats = video_features(raw)
    if not feats or raw.episodes is None or raw.episodes.num_rows == 0:
        return []
    if not have_av():
        return [
            Finding("video.readable", WARNING, f"video checks skipped: {INSTALL_HINT}", INFO_FILE)
        ]
    e = raw.episodes
    fps = raw.fps or 30.0
    ep_index = e["episode_index"].to_numpy()
    length = e["length"].to_numpy().astype(np.int64)
    out: list[Finding] = []
    for key, feat in feats.items():
        groups, problems = _segments(raw, key)
        out += problems
        decl = _declared(feat, raw)
        for rel, rows in groups:
            first_ep = int(ep_index[rows[0]])
            if not raw.fs.exists(raw.join(rel)):
                continue  # info.videos reports it
            try:
                index = _probe(raw, rel, boxes)
            except (VideoError, OSError) as exc:
                msg = f"cannot read video: {exc}".replace(raw.join(rel) + ": ", "")
                out.append(Finding("video.readable", ERROR, msg, rel, first_ep))
                continue
            if index is None:
                _note(
                    notes,
                    f"{rel}: its mp4 boxes do not describe it (fragmented, several "
                    "edits): no video check judged it",
                )
                continue
            found = _stream_findings(index, decl, rel, first_ep)
            found += stream_findings(index, feat, rel, first_ep)  # channels, audio, GOP
            if index.undecided:
                drop = {c for fact in index.undecided for c in _UNDECIDED_CHECKS[fact]}
                found = [f for f in found if f.check not in drop]
                facts = " and ".join(index.undecided)
                _note(
                    notes,
                    f"{rel}: its boxes do not settle the {facts}: "
                    f"{', '.join(sorted(drop))} not judged",
                )
            out += found
            if raw.version in V2:
                start = np.zeros(len(rows))
                stop = length[rows] / fps
            else:
                start = e[f"videos/{key}/from_timestamp"].to_numpy()[rows].astype(np.float64)
                stop = e[f"videos/{key}/to_timestamp"].to_numpy()[rows].astype(np.float64)
            order = np.argsort(start, kind="stable")
            rows, start, stop = rows[order], start[order], stop[order]
            out += episode_findings(
                index.seconds,
                ep_index[rows],
                start,
                stop,
                length[rows],
                fps,
                tolerance_s,
                rel,
            )
            if deep and "video.decode" in want:
                try:
                    with _source(raw, rel) as (full, fh):
                        n = decode_all(full, fileobj=fh)
                except VideoError as exc:
                    msg = str(exc).replace(raw.join(rel) + ": ", "")
                    out.append(Finding("video.decode", ERROR, msg, rel, first_ep))
                    continue
                if n != index.num_frames:
                    msg = f"decoded {n} frames of {index.num_frames} packets"
                    out.append(Finding("video.decode", ERROR, msg, rel, first_ep))
    return [f for f in out if f.check in want]
