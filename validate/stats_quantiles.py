"""``stats.quantile_rank`` (``--deep``): how far stats.json's quantiles are from the data, in rank.

LeRobot writes a dataset's q01..q99 as the count-weighted mean of its episodes' quantiles: on
data its recorder wrote, ``q99`` is the data's ~85th percentile. That is not damage (LeRobot
reads them, policies normalize with them), so it is a warning, one per feature whose worst key
is more than :data:`WARN_RANK` away: the key, the dimension and the rank the value really has
(:mod:`episodekit.metadata.stats.rank`). Stats episodekit writes are within 0.005.
"""

from __future__ import annotations

import numpy as np

from episodekit.core.dataset import DatasetError
from episodekit.metadata.stats import QUANTILE_KEYS, QUANTILES, STATS_FILE
from episodekit.metadata.stats.rank import stored_rank_errors
from episodekit.validate.artifacts import dataset_from_raw
from episodekit.validate.raw import WARNING, Finding, RawRoot

CHECK = "stats.quantile_rank"
WARN_RANK = 0.01  # rank error (fraction of the frames) beyond which a quantile is reported


def check_quantile_ranks(
    raw: RawRoot, dataset: dict[str, dict[str, np.ndarray]], feats: dict[str, int]
) -> list[Finding]:
    """One warning per numeric feature whose stored quantiles are off by more than
    :data:`WARN_RANK` in rank (``dataset``: stats.json's parsed values)."""
    ds = dataset_from_raw(raw)
    if ds is None:
        return []
    try:
        errors = stored_rank_errors(ds, dataset, feats)
    except (DatasetError, OSError, ValueError) as exc:
        return [Finding(CHECK, WARNING, f"cannot measure the quantiles' rank: {exc}", STATS_FILE)]
    out = []
    for n, per in errors.items():
        keys = [k for k in per if k != "_rank"]
        worst = max(keys, key=lambda k: float(np.max(per[k])))
        d = int(np.argmax(per[worst]))
        err = float(per[worst][d])
        if err <= WARN_RANK:
            continue
        rank = float(per["_rank"][keys.index(worst)][d])
        q = QUANTILES[QUANTILE_KEYS.index(worst)]
        out.append(
            Finding(
                CHECK,
                WARNING,
                f"{n}/{worst} (dimension {d}) sits at rank {rank:.3f} of the data, not {q:g} "
                f"(rank error {err:.3f}); `episodekit metadata stats {raw.root} --force` writes "
                "exact ones",
                STATS_FILE,
                feature=n,
                dimension=d,
                value=round(err, 4),
            )
        )
    return out
