"""``validate --metadata-only`` and ``--sample-episodes``: CI validation of hub and HTTP roots.

On copies of LeRobot-written fixtures: the metadata-only run finds nothing the full run does not,
finds a metadata corruption exactly as the full run does, and does not claim the checks that
need data pages (a data-page corruption passes, and the report lists those checks as not run).
Through a real HTTP server (scripts/range_server.py: the standard library's http.server with
Range requests, in a thread on 127.0.0.1) with fsspec's ``http`` filesystem as the client: the
same findings, and the bytes the server sent per file stay near the footers and the mp4 boxes.
The sample is deterministic, reads only the row groups holding its episodes, and catches a
corruption inside one of them.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("aiohttp")  # fsspec's http filesystem

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "lerobot"
CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]
DATA = "data/chunk-000/file-000.parquet"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"


def _server_module():
    spec = importlib.util.spec_from_file_location("range_server", REPO / "scripts/range_server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


range_server = _server_module()


def validate(root, *extra: str) -> tuple[int, dict]:
    r = subprocess.run(
        [*CLI, "validate", str(root), "--json", "-q", *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-2000:]
    return r.returncode, json.loads(r.stdout)


def keyed(doc: dict, root: str) -> dict[str, set[tuple]]:
    """Findings by check as (severity, file, episode, message), the root's name replaced."""
    out: dict[str, set[tuple]] = {}
    for f in doc["findings"]:
        msg = f["message"].replace(root, "ROOT")
        out.setdefault(f["check"], set()).add((f["severity"], f["file"], f["episode"], msg))
    return out


def assert_same_as_full(meta: dict, full: dict, meta_root: str, full_root: str) -> None:
    """Every check the metadata-only run ran gives the full run's findings (a check run in part:
    a subset of them)."""
    a, b = keyed(meta, meta_root), keyed(full, full_root)
    for check in meta["checks_run"]:
        got, want = a.get(check, set()), b.get(check, set())
        if check in meta.get("checks_partial", {}):
            assert got <= want, (check, got - want)
        else:
            assert got == want, (check, got, want)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("mo")
    for name in ("rec40", "edited35", "vid24"):
        shutil.copytree(FIXTURES / name, d / name)
    return d


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------------------------------------
# Local roots


@pytest.mark.parametrize("name", ["rec40", "edited35", "vid24"])
def test_clean_lerobot_fixtures_give_the_full_runs_findings_and_no_error(fixtures, name):
    root = fixtures / name
    code, meta = validate(root, "--metadata-only")
    _, full = validate(root)
    assert code == 0 and meta["counts"]["error"] == 0
    assert_same_as_full(meta, full, str(root), str(root))
    assert meta["scope"] == {"mode": "metadata-only", "seed": None, "sample_episodes": None}
    # Which checks ran and which did not, and why.
    skipped = meta["checks_skipped"]
    assert {"data.rows", "data.nan", "quality.frozen"} <= set(skipped)
    assert not set(skipped) & set(meta["checks_run"])
    assert {"info.totals", "info.features", "layout.row_groups", "stats.order"} <= set(
        meta["checks_run"]
    )
    assert "data.read" in meta["checks_partial"]
    if name == "vid24":
        assert {"video.codec", "video.frames", "video.timestamps"} <= set(meta["checks_run"])
        assert "video.decode" not in meta["checks_run"]


def _truncate_footer(root: Path) -> None:
    p = root / DATA
    p.write_bytes(p.read_bytes()[:-50])


def _missing_data_file(root: Path) -> None:
    t = pq.read_table(root / EPISODES)
    i = t.column_names.index("data/file_index")
    values = t["data/file_index"].to_pylist()
    values[3] = 7
    pq.write_table(t.set_column(i, t.schema.field(i), pa.array(values, t.schema.field(i).type)),
                   root / EPISODES)  # fmt: skip


def _edit_info(**changes):
    def go(root: Path) -> None:
        p = root / "meta/info.json"
        info = json.loads(p.read_text())
        for key, value in changes.items():
            target = info
            *path, last = key.split("/")
            for k in path:
                target = target[k]
            target[last] = value
        p.write_text(json.dumps(info, indent=4))

    return go


def _stats_order(root: Path) -> None:
    p = root / "meta/stats.json"
    s = json.loads(p.read_text())
    s["action"]["max"][0] = s["action"]["min"][0] - 1.0
    p.write_text(json.dumps(s))


def _cut_mp4(root: Path) -> None:
    p = next(iter(sorted((root / "videos").rglob("*.mp4"))))
    p.write_bytes(p.read_bytes()[:-1000])


METADATA_CORRUPTIONS = {
    "total_frames": ("rec40", _edit_info(total_frames=12_000), "info.totals"),
    "broken_footer": ("rec40", _truncate_footer, "data.read"),
    "episodes_row_to_a_missing_file": ("edited35", _missing_data_file, "info.paths"),
    "stats_json_order": ("rec40", _stats_order, "stats.order"),
    "video_codec": (
        "vid24",
        _edit_info(**{"features/observation.images.top/info/video.codec": "h264"}),
        "video.codec",
    ),
    "video_cut_short": ("vid24", _cut_mp4, "video.readable"),
}


@pytest.mark.parametrize("case", sorted(METADATA_CORRUPTIONS))
def test_a_metadata_corruption_is_found_as_the_full_run_finds_it(fixtures, tmp_path, case):
    name, damage, check = METADATA_CORRUPTIONS[case]
    root = copy(fixtures / name, tmp_path / name)
    damage(root)
    code, meta = validate(root, "--metadata-only")
    _, full = validate(root)
    assert code == 1
    assert check in {f["check"] for f in meta["findings"] if f["severity"] == "error"}
    assert_same_as_full(meta, full, str(root), str(root))
    mine = keyed(meta, str(root))[check]
    assert mine == keyed(full, str(root))[check]  # exactly: file, episode and message


def _nan_in_action(root: Path, episode: int) -> None:
    t = pq.read_table(root / DATA)
    rows = np.flatnonzero(t["episode_index"].to_numpy() == episode)
    i = t.column_names.index("action")
    a = np.stack(t["action"].to_numpy(zero_copy_only=False)).astype(np.float32)
    a[rows[len(rows) // 2], 1] = np.nan
    col = pa.FixedSizeListArray.from_arrays(pa.array(a.ravel()), a.shape[1])
    col = col.cast(t.schema.field(i).type)
    t = t.set_column(i, t.schema.field(i), col)
    groups = pq.read_metadata(root / DATA).num_row_groups
    with pq.ParquetWriter(root / DATA, t.schema) as w:  # the recorder's layout: a group each
        if groups > 1:
            ep = t["episode_index"].to_numpy()
            for e in np.unique(ep):
                w.write_table(t.filter(pa.array(ep == e)))
        else:
            w.write_table(t)


def test_a_data_page_corruption_is_not_claimed_as_checked(fixtures, tmp_path):
    root = copy(fixtures / "rec40", tmp_path / "rec40")
    _nan_in_action(root, 5)
    code_full, full = validate(root)
    assert code_full == 1 and {"data.nan"} <= {f["check"] for f in full["findings"]}
    code, meta = validate(root, "--metadata-only")
    assert code == 0, meta["findings"]
    assert "data.nan" in meta["checks_skipped"] and "data.nan" not in meta["checks_run"]


def test_sample_is_deterministic_and_catches_a_corruption_in_a_sampled_episode(fixtures, tmp_path):
    root = copy(fixtures / "rec40", tmp_path / "rec40")
    _, first = validate(root, "--sample-episodes", "6")
    _, again = validate(root, "--sample-episodes", "6")
    sample = first["scope"]["sample_episodes"]
    assert sample == again["scope"]["sample_episodes"] and len(sample) == 6
    assert sample[0] == 0 and sample[-1] == 39
    _, other = validate(root, "--sample-episodes", "6", "--sample-seed", "3")
    assert other["scope"]["sample_episodes"] != sample and other["scope"]["seed"] == 3
    assert first["checks_partial"]["data.nan"] == "the 6 sampled episodes only"
    inside = sample[2]
    outside = next(e for e in range(40) if e not in sample)
    _nan_in_action(root, inside)
    code, doc = validate(root, "--sample-episodes", "6")
    assert code == 1
    nan = [f for f in doc["findings"] if f["check"] == "data.nan"]
    assert [f["episode"] for f in nan] == [inside], doc["findings"]
    # Outside the sample: not found, and the report says data.nan judged the sample only.
    clean = copy(fixtures / "rec40", tmp_path / "rec40b")
    _nan_in_action(clean, outside)
    code, doc = validate(clean, "--sample-episodes", "6")
    assert code == 0 and "data.nan" in doc["checks_partial"]


def test_sample_choice_first_last_and_seeded():
    from episodekit.validate.scope import sample_episodes

    eps = np.arange(1000)
    a = sample_episodes(eps, 10, seed=0)
    assert a == sample_episodes(eps[::-1].copy(), 10, seed=0)  # the order of the table: none
    assert len(a) == 10 and a == sorted(set(a)) and a[0] == 0 and a[-1] == 999
    assert sample_episodes(eps, 10, seed=1) != a
    assert sample_episodes(eps, 5000) == eps.tolist()
    assert sample_episodes(eps, 1) == [0]
    spread = np.array(sample_episodes(eps, 100))
    assert np.histogram(spread, bins=4, range=(0, 1000))[0].min() >= 10  # over the whole root


def test_sample_seed_needs_sample_episodes(fixtures):
    r = subprocess.run(
        [*CLI, "validate", str(fixtures / "rec40"), "--sample-seed", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--sample-seed needs --sample-episodes" in r.stderr


# ---------------------------------------------------------------------------------------------
# Through an HTTP server with Range requests


def _moov_size(path: Path) -> int:
    data, pos = path.read_bytes(), 0
    while pos + 8 <= len(data):
        size, typ = struct.unpack_from(">I4s", data, pos)
        if typ == b"moov":
            return size
        pos += size
    raise AssertionError(f"no moov in {path}")


def _footer_size(path: Path) -> int:
    data = path.read_bytes()
    return int.from_bytes(data[-8:-4], "little") + 8


@pytest.mark.parametrize("listing", [True, False], ids=["folder-pages", "no-folder-pages"])
def test_over_http_the_same_findings_and_bytes_near_the_footers_and_boxes(
    fixtures, tmp_path, listing
):
    root = copy(fixtures / "vid24", tmp_path / "vid24")
    _edit_info(total_frames=9)(root)  # one metadata finding to carry through
    _, full = validate(root)
    with range_server.serve(root, listing=listing) as server:
        code, meta = validate(server.url, "--metadata-only")
        sent = dict(server.counters.by_path)
        url = server.url
    assert code == 1
    assert_same_as_full(meta, full, url, str(root))
    assert "info.totals" in {f["check"] for f in meta["findings"]}
    if not listing:  # meta/episodes found by LeRobot's numbering; nothing lists data/
        assert "info.unreferenced" in meta["checks_skipped"]
    else:
        assert "info.unreferenced" in meta["checks_run"]
    for p in sorted(root.rglob("*")):
        rel = "/" + p.relative_to(root).as_posix()
        if not p.is_file() or rel not in sent:
            continue
        if rel.startswith("/data/"):  # the footer (a 16 KiB guess first), never the pages
            assert sent[rel] <= max(16 * 1024, _footer_size(p)) + 8, rel
        elif rel.startswith("/videos/"):  # the box headers and moov, never mdat
            assert sent[rel] <= _moov_size(p) + 256, (rel, sent[rel], _moov_size(p))
        else:  # meta/: each file once
            assert sent[rel] <= p.stat().st_size, rel
    data_and_video = sum(p.stat().st_size for d in ("data", "videos") for p in (root / d).rglob("*")
                         if p.is_file())  # fmt: skip
    read = sum(n for rel, n in sent.items() if rel.startswith(("/data/", "/videos/")))
    assert read < 0.15 * data_and_video, (read, data_and_video)


def test_sample_over_http_reads_only_the_row_groups_of_its_episodes(fixtures, tmp_path):
    root = copy(fixtures / "rec40", tmp_path / "rec40")  # one row group per episode
    with range_server.serve(root) as server:
        _, meta = validate(server.url, "--sample-episodes", "4")
        sent = server.counters.by_path["/" + DATA]
    md = pq.read_metadata(root / DATA)
    sample = meta["scope"]["sample_episodes"]
    groups = sum(
        md.row_group(i).column(j).total_compressed_size
        for i in sample
        for j in range(md.num_columns)
    )
    assert meta["counts"]["error"] == 0 and len(sample) == 4
    assert groups <= sent <= groups + max(16 * 1024, _footer_size(root / DATA)) + 4096
    assert sent < (root / DATA).stat().st_size / 4


def test_memory_root_metadata_only_in_process(fixtures):
    """Any fsspec root (here ``memory://``, the library call): the local run's findings."""
    import fsspec

    from episodekit.validate import Scope, validate

    src = fixtures / "vid24"
    mem = fsspec.filesystem("memory")
    for p in src.rglob("*"):
        if p.is_file():
            mem.pipe(f"/mo-vid24/{p.relative_to(src).as_posix()}", p.read_bytes())
    meta = validate("memory://mo-vid24", scope=Scope(metadata_only=True)).to_dict()
    full = validate(str(src)).to_dict()
    assert meta["counts"]["error"] == 0 and "data.rows" in meta["checks_skipped"]
    assert_same_as_full(meta, full, "memory://mo-vid24", str(src))
    mem.rm("/mo-vid24", recursive=True)
