"""`prepare` writes the same bytes as before its steps became a pipeline: sha256 of every file a
`prepare` run leaves (one root, and a mixture of two), pinned from a run of the code before the
refactor. The validation stamp holds mtimes: it is digested without its ``state`` key;
a mixture plan without its ``fingerprint``
(a hash of the sources' absolute paths; the paths themselves are replaced).

Re-record (only for an intended change of an output, and say which in the commit):
    .venv/bin/python tests/app/test_prepare_digests.py
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from episodekit.core.paths import STAMP_FILE
from episodekit.sample import write_sample

# {relative path: sha256[:20]} of the inputs (the sample writer) and of every file after prepare
PINNED = {
    "root_inputs": {
        "root/data/chunk-000/file-000.parquet": "074a2ffd9e37398546b2",
        "root/data/chunk-000/file-001.parquet": "120a87288f28517df689",
        "root/meta/episodes/chunk-000/file-000.parquet": "02f64155bcd440be143e",
        "root/meta/info.json": "d5ceeadf50dc7af582ab",
        "root/meta/stats.json": "18544791af1c79b307fc",
        "root/meta/tasks.parquet": "882036c164d15849e046",
    },
    "root": {
        "root/data/chunk-000/file-000.parquet": "a78792c7dd65879a1c79",
        "root/data/chunk-000/file-001.parquet": "9179bcb0ec2d0dc94bf2",
        "root/meta/episode_costs.parquet": "4a38020e34b518dd4068",
        "root/meta/episodekit_sketches.parquet": "01fc0864545bc550365e",
        "root/meta/episodekit_stats.parquet": "559682bc6f476f18845a",
        "root/meta/episodekit_validation.json": "e13213e45fe1d053dfb3",
        "root/meta/episodes/chunk-000/file-000.parquet": "0d24f91b9cb78bff21ea",
        "root/meta/info.json": "d5ceeadf50dc7af582ab",
        "root/meta/shard_plans/canonical_c2.json": "af6988da6fd4565b5525",
        "root/meta/shard_plans/ws2_nw2.json": "bd2ee9acb79e88f5398e",
        "root/meta/shard_plans/ws4_nw2.json": "36d2a3d9f5bff58f829d",
        "root/meta/speed_percentiles.jsonl": "f26a130053d90694780e",
        "root/meta/stats.json": "5bfb7374410ef14e9e5a",
        "root/meta/tasks.parquet": "882036c164d15849e046",
    },
    "mixture_inputs": {
        "a/data/chunk-000/file-000.parquet": "2b7bbde0a492c91829f0",
        "a/meta/episodes/chunk-000/file-000.parquet": "43c966602123c861b6dc",
        "a/meta/info.json": "7d27d81eaa68e7edd359",
        "a/meta/stats.json": "d24d29d91e402f3c58b3",
        "a/meta/tasks.parquet": "8e604d9077ea324fc982",
        "b/data/chunk-000/file-000.parquet": "e494ab301ebba075705c",
        "b/meta/episodes/chunk-000/file-000.parquet": "021f9506024a94028a57",
        "b/meta/info.json": "ca557714c345c6d1f67c",
        "b/meta/stats.json": "796288cd459ae551b11c",
        "b/meta/tasks.parquet": "be87d703f5345249624d",
    },
    "mixture": {
        "a/data/chunk-000/file-000.parquet": "33daa131db976f11667e",
        "a/meta/episode_costs.parquet": "ad9ed2e0ae8b5c89bc07",
        "a/meta/episodekit_sketches.parquet": "bf01bc38d3dbe51ed6e2",
        "a/meta/episodekit_stats.parquet": "4de2e154b337e0ae625d",
        "a/meta/episodekit_validation.json": "e13213e45fe1d053dfb3",
        "a/meta/episodes/chunk-000/file-000.parquet": "a90896feaf2e717d50a0",
        "a/meta/info.json": "7d27d81eaa68e7edd359",
        "a/meta/shard_plans/ws2_nw2.json": "ca72bd65de4e33a5e240",
        "a/meta/shard_plans/ws3_nw2.json": "65903ad7bcf679b415e4",
        "a/meta/speed_percentiles.jsonl": "fbc10f92b256af687f3c",
        "a/meta/stats.json": "1a0e1b36c4319536c40d",
        "a/meta/tasks.parquet": "8e604d9077ea324fc982",
        "b/data/chunk-000/file-000.parquet": "a048cc07c160bd966c89",
        "b/meta/episode_costs.parquet": "2c2fbed42dd883f1ee1a",
        "b/meta/episodekit_sketches.parquet": "24612122dc745f07aad2",
        "b/meta/episodekit_stats.parquet": "747dc6268da30b367c56",
        "b/meta/episodekit_validation.json": "e13213e45fe1d053dfb3",
        "b/meta/episodes/chunk-000/file-000.parquet": "ca661807280cf66730fe",
        "b/meta/info.json": "ca557714c345c6d1f67c",
        "b/meta/shard_plans/ws2_nw2.json": "081a0b06730097ef35c0",
        "b/meta/shard_plans/ws3_nw2.json": "99bd1b6df3b441e893ca",
        "b/meta/speed_percentiles.jsonl": "d1295e6a449b0546fa9a",
        "b/meta/stats.json": "d8e4dca9f8b9c073ea45",
        "b/meta/tasks.parquet": "be87d703f5345249624d",
        "plans/mixture.json": "c918479dd982387a85f1",
        "plans/ws2_nw2.json": "2d38e1ba26c73355f92a",
        "plans/ws3_nw2.json": "6d0b5f2bf3f5eb40b5f5",
    },
}


def _digests(base: Path, only: Path | None = None) -> dict[str, str]:
    out = {}
    for p in sorted((only or base).rglob("*")):
        if not p.is_file() or p.name.startswith("."):
            continue
        data = p.read_bytes().replace(str(base).encode(), b"<BASE>")
        rel = p.relative_to(base).as_posix()
        if rel.endswith(STAMP_FILE) or rel.startswith("plans/ws"):
            doc = json.loads(data)
            doc.pop("state", None)  # the stamp's size/mtime digest
            doc.pop("rerun", None)  # the stamp's record for a no-op rerun (holds timings)
            doc.pop("fingerprint", None)  # a mixture plan's: a hash of its sources' paths
            data = json.dumps(doc, sort_keys=True).encode()
        out[rel] = hashlib.sha256(data).hexdigest()[:20]
    return out


def root_case(base: Path, **prepare_kw) -> tuple[dict, dict]:
    """A 40-episode recorded sample (two data files), prepared with two plans and a canonical."""
    from episodekit.prepare import prepare

    root = base / "root"
    write_sample(root, episodes=40, style="recorded", data_files_size_in_mb=1, seed=3)
    inputs = _digests(base)
    res = prepare(
        str(root), target_mb=1, world_sizes=(2, 4), num_workers=2, jobs=1, split_long="no",
        canonical_bins=None, **prepare_kw,
    )  # fmt: skip
    assert res.ok, res.to_dict()
    return inputs, _digests(base)


def mixture_case(base: Path, **prepare_kw) -> tuple[dict, dict]:
    """Two samples (one edited: one big row group), prepared and planned as a mixture."""
    from episodekit.mixture import prepare_mixture

    a = write_sample(base / "a", episodes=40, tasks=3, seed=1, mean_length=40)
    b = write_sample(base / "b", episodes=24, tasks=2, seed=2, mean_length=30, style="edited")
    inputs = _digests(base)
    spec = {"sources": [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 3}]}
    res = prepare_mixture(
        spec, str(base / "plans"), world_sizes=[2, 3], num_workers=2, jobs=1, split_long="no",
        **prepare_kw,
    )  # fmt: skip
    assert res.ok and res.plans, res.to_dict()
    return inputs, _digests(base)


def _check(case: str, inputs: dict, outputs: dict) -> None:
    assert inputs == PINNED[f"{case}_inputs"], (
        "the sample writer's output changed: the pinned digests no longer describe these inputs; "
        "re-record them (see this module's docstring) on a commit whose prepare is trusted"
    )
    assert outputs == PINNED[case]


def test_prepare_root_bytes_pinned(tmp_path):
    # the pinned run replaced the sample's stats (before stats were kept): --stats recompute
    _check("root", *root_case(tmp_path, stats="recompute"))


def test_prepare_mixture_bytes_pinned(tmp_path):
    _check("mixture", *mixture_case(tmp_path, stats="recompute"))


def _kept(pinned: dict, inputs: dict) -> dict:
    """The pinned outputs with the inputs' stats kept: stats.json and meta/episodes as they were,
    no summary or sketches of ours."""
    ours = ("meta/episodekit_stats.parquet", "meta/episodekit_sketches.parquet")
    out = {k: v for k, v in pinned.items() if not k.endswith(ours)}
    for k, v in inputs.items():
        if k.endswith("meta/stats.json") or "/meta/episodes/" in k:
            out[k] = v
    return out


def test_prepare_root_keeps_the_datasets_stats_bytes_pinned(tmp_path):
    inputs, outputs = root_case(tmp_path)
    assert outputs == _kept(PINNED["root"], PINNED["root_inputs"])


def test_prepare_mixture_keeps_the_sources_stats_bytes_pinned(tmp_path):
    inputs, outputs = mixture_case(tmp_path)
    assert outputs == _kept(PINNED["mixture"], PINNED["mixture_inputs"])


if __name__ == "__main__":  # print the table to paste into PINNED
    import tempfile

    table = {}
    for name, fn in (("root", root_case), ("mixture", mixture_case)):
        with tempfile.TemporaryDirectory() as tmp:
            # the pinned run replaces the inputs' stats, as the *_bytes_pinned tests do
            table[f"{name}_inputs"], table[name] = fn(Path(tmp), stats="recompute")
    json.dump(table, sys.stdout, indent=4)
    print()
