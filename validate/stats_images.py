"""Image/video features' stats, checked where they exist (written with ``--images``): LeRobot's
shapes, finite, in [0, 1], ordered, counting the sampled frames."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.dataset import V3, DatasetError
from episodekit.core.words import plural
from episodekit.metadata.image_stats import estimate_num_samples, image_features
from episodekit.metadata.stats import (
    STAT_KEYS,
    STATS_FILE,
    read_summary_meta,
)
from episodekit.metadata.stats.episode_merge import MERGED_KEYS, EpisodeMerge
from episodekit.validate.artifacts import dataset_from_raw
from episodekit.validate.raw import ERROR, Finding, RawRoot
from episodekit.validate.stats_episodes import order_rows
from episodekit.validate.stats_rules import (
    LEROBOT_BINS,
    LEROBOT_PAD,
    consistency_findings,
    missing_finding,
    order_findings,
)


def _image_values(v, key: str) -> tuple[np.ndarray | None, str]:
    """An image stat as a channel vector: stats.json needs LeRobot's ``(C, 1, 1)`` (C 3 or 1),
    count ``[N]``."""
    try:
        arr = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        return None, f"not numbers ({str(v)[:40]})"
    if key == "count":
        return (arr.reshape(1), "") if arr.shape == (1,) else (None, f"shape {list(arr.shape)}")
    if arr.shape not in ((3, 1, 1), (1, 1, 1)):
        return None, f"shape {list(arr.shape)}, expected [3, 1, 1] (or [1, 1, 1])"
    return arr.reshape(-1), ""


# LeRobot's image quantiles come from the same padded histogram (values / 255 in [0, 1]): a
# quantile may sit the padding plus one bin (of at most 1.0 / 5000) outside [0, 1].
UNIT_SLACK = (1 + 2 * LEROBOT_PAD) / LEROBOT_BINS + LEROBOT_PAD


def _outside_unit(v: np.ndarray) -> np.ndarray:
    return (v < -UNIT_SLACK) | (v > 1 + UNIT_SLACK)


def _image_range(name: str, got: dict[str, np.ndarray], file, episode=None) -> list[Finding]:
    bad = [k for k, v in got.items() if k != "count" and np.any(_outside_unit(v))]
    if not bad:
        return []
    msg = f"{name}: {bad} outside [0, 1] (image stats are pixel values / 255; {UNIT_SLACK:g} slack)"
    return [Finding("stats.order", ERROR, msg, file, episode)]


def _expected_samples(raw: RawRoot) -> np.ndarray | None:
    """LeRobot's sampled frames per episode (what ``count`` of image stats is), in table order."""
    if raw.episodes is None:
        return None
    return np.array([estimate_num_samples(int(n)) for n in raw.episodes["length"].to_numpy()])


def _image_dataset_part(
    raw: RawRoot, feats: list[str], ours: set[str], parsed: dict
) -> list[Finding]:
    """Findings on the image entries of stats.json; their values go into ``parsed``."""
    out: list[Finding] = []
    try:
        data = json.loads(raw.read_bytes(raw.join(STATS_FILE)))
    except (ValueError, UnicodeDecodeError, OSError):
        return out  # stats.present reports it
    samples = _expected_samples(raw)
    for name in feats:
        entry = data.get(name) if isinstance(data, dict) else None
        if not isinstance(entry, dict):
            continue  # image stats are optional (computed with --images)
        missing = [k for k in STAT_KEYS if k not in entry]
        if missing:
            out.append(missing_finding(name, missing, STATS_FILE, raw.root, images=True))
        got = {}
        for key in STAT_KEYS:
            if key not in entry:
                continue
            arr, why = _image_values(entry[key], key)
            if arr is None:
                out.append(Finding("stats.shape", ERROR, f"{name}/{key}: {why}", STATS_FILE))
            elif not np.all(np.isfinite(arr)):
                out.append(Finding("stats.finite", ERROR, f"{name}/{key}: not finite", STATS_FILE))
            else:
                got[key] = arr
        parsed[name] = got
        out += order_findings(name, got, STATS_FILE) + _image_range(name, got, STATS_FILE)
        if "count" in got and samples is not None:
            n, want = int(got["count"][0]), int(samples.sum())
            frames = int(raw.episodes["length"].to_numpy().sum())
            if (name in ours and n != want) or not 1 <= n <= frames:
                msg = f"{name}/count is {n}: " + (
                    f"LeRobot's sampling gives {want} sampled frames"
                    if name in ours
                    else f"expected 1..{frames} (sampled frames)"
                )
                out.append(Finding("stats.count", ERROR, msg, STATS_FILE))
    return out


def _flat_channels(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per-episode values of a (nested) list column: (values flattened, values per episode)."""
    lengths = None
    while (
        pa.types.is_list(col.type)
        or pa.types.is_large_list(col.type)
        or (pa.types.is_fixed_size_list(col.type))
    ):
        if lengths is None:
            lengths = pc.list_value_length(col).fill_null(0).to_numpy().astype(np.int64)
        else:  # inner lists must hold one value each ((C, 1, 1)): count leaves per episode
            inner = pc.list_value_length(col).fill_null(0).to_numpy().astype(np.int64)
            if np.any(inner != 1):
                return np.zeros(0), np.full(len(lengths), -1)
        col = pc.list_flatten(col)
    vals = col.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    return vals, lengths if lengths is not None else np.full(len(vals), -1)


def _image_episode_part(
    raw: RawRoot, feats: list[str], ours: set[str], merges: dict[str, EpisodeMerge | None]
) -> list[Finding]:
    """Findings on the per-episode image columns; the stats of ``ours`` are folded file by file
    into ``merges`` (a feature becomes None when a file has only some of ``MERGED_KEYS``)."""
    out: list[Finding] = []
    e = raw.episodes
    if e is None:
        return out
    samples = _expected_samples(raw)
    length = e["length"].to_numpy()
    ep_all = e["episode_index"].to_numpy()
    for rel in sorted(pc.unique(e["__file"]).to_pylist()):
        rows = np.flatnonzero(pc.equal(e["__file"], rel).to_numpy(zero_copy_only=False))
        full = raw.join(rel)
        try:
            names = raw.meta_schema(full).names
            cols = [f"stats/{n}/{k}" for n in feats for k in STAT_KEYS]
            present = [c for c in cols if c in names]
            if not present:
                continue
            t = raw.meta_table(full, columns=present)
        except (DatasetError, pa.ArrowException, OSError):
            continue  # episodes.read reports it
        if t.num_rows != len(rows):
            continue
        for n in feats:
            got = {}
            for k in STAT_KEYS:
                c = f"stats/{n}/{k}"
                if c not in present:
                    continue
                vals, per = _flat_channels(t[c].combine_chunks())
                want = (1,) if k == "count" else (3, 1)
                bad = np.flatnonzero(~np.isin(per, want))
                if len(bad) or len(vals) != int(per.sum()) or len(set(per.tolist())) > 1:
                    i = int(bad[0]) if len(bad) else 0
                    out.append(
                        Finding(
                            "stats.shape",
                            ERROR,
                            f"{c}: {plural(int(per[i]), 'value')} per episode, expected "
                            f"{'[1]' if k == 'count' else '[3, 1, 1] (or [3])'}",
                            rel,
                            int(ep_all[rows][i]),
                        )
                    )
                    continue
                v = vals.reshape(len(rows), -1)
                fin = np.flatnonzero(~np.all(np.isfinite(v), axis=1))
                if len(fin):
                    msg = f"{c}: {plural(len(fin), 'episode')} with NaN/inf"
                    out.append(Finding("stats.finite", ERROR, msg, rel, int(ep_all[rows][fin[0]])))
                    continue
                got[k] = v
            ep = ep_all[rows]
            if n in ours:
                _fold(merges, n, got)
            out += order_rows(n, got, ep)
            bad = np.flatnonzero(
                np.any(
                    [np.any(_outside_unit(v), axis=1) for k, v in got.items() if k != "count"]
                    or [np.zeros(len(rows), bool)],
                    axis=0,
                )
            )
            if len(bad):
                msg = f"stats/{n}: {plural(len(bad), 'episode')} with values outside [0, 1]"
                out.append(Finding("stats.order", ERROR, msg, rel, int(ep[bad[0]])))
            if "count" in got:
                cnt = got["count"][:, 0]
                want = samples[rows] if n in ours else None
                bad = np.flatnonzero(
                    (cnt != want) if want is not None else (cnt < 1) | (cnt > length[rows])
                )
                if len(bad):
                    msg = f"stats/{n}/count: {plural(len(bad), 'episode')} whose count is not " + (
                        "LeRobot's sampled frames" if want is not None else "in 1..length"
                    )
                    out.append(Finding("stats.count", ERROR, msg, rel, int(ep[bad[0]])))
    return out


def _fold(merges: dict[str, EpisodeMerge | None], n: str, got: dict[str, np.ndarray]) -> None:
    """Fold one file's image stats of ``n`` into its merge: a file without any of
    ``MERGED_KEYS`` adds nothing, one with only some of them leaves nothing to compare."""
    have = set(MERGED_KEYS) & set(got)
    if have == set(MERGED_KEYS) and merges.get(n, EpisodeMerge()) is not None:
        merges.setdefault(n, EpisodeMerge()).add(got)
    elif have:
        merges[n] = None


def check_image_stats(raw: RawRoot) -> list[Finding]:
    """Image/video stats where present: LeRobot's shapes, finite, in [0, 1], ordered, count of
    sampled frames (exactly LeRobot's sampling when episodekit wrote them)."""
    feats = list(image_features(raw.info))
    if not feats or raw.version != V3:
        return []
    ds = dataset_from_raw(raw)
    rec = ((read_summary_meta(ds) if ds is not None else None) or {}).get("images") or {}
    fresh = ds is not None and rec.get("fingerprint") == ds.fingerprint
    ours = set(rec.get("features") or {}) if fresh else set()
    dataset: dict = {}
    merges: dict[str, EpisodeMerge | None] = {}
    out = _image_dataset_part(raw, feats, ours, dataset)
    out += _image_episode_part(raw, feats, ours, merges)
    # written by --images: the dataset's stats are the sampled-frame-weighted merge of the
    # episodes' (every frame of a feature has the same size); others may use another weighting
    merged = {n: m.merged() for n, m in merges.items() if m is not None and n in dataset}
    return out + consistency_findings([n for n in feats if n in merged], dataset, merged)
