"""validate's raw root parses info.json once, tolerantly (core.layout ``Info.parse_tolerant``):
the findings of that parse are kept, a bad key reads as absent, and fps is a positive *finite*
number (``1e999`` reads as infinity: it was taken as a rate and passed ``info.fps``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from episodekit.validate.meta import check_fps
from episodekit.validate.raw import read_raw

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"


def rec40_with(tmp_path: Path, text_edit) -> Path:
    root = tmp_path / "rec40"
    shutil.copytree(FIXTURES / "rec40", root)
    path = root / "meta/info.json"
    path.write_text(text_edit(path.read_text()))
    return root


def test_sound_info_parses_without_findings(tmp_path):
    raw = read_raw(str(rec40_with(tmp_path, lambda t: t)))
    assert raw.layout is not None and raw.layout_findings == []
    assert raw.fps == 30.0 and raw.version == "v3.0"
    assert raw.layout.to_dict() == json.loads((FIXTURES / "rec40/meta/info.json").read_text())


@pytest.mark.parametrize("value", ["1e999", "true", "-30", '"30"'])
def test_fps_that_is_not_a_positive_finite_number_is_a_finding(tmp_path, value):
    root = rec40_with(tmp_path, lambda t: t.replace('"fps": 30', f'"fps": {value}'))
    raw = read_raw(str(root))
    assert raw.fps is None
    assert [f.key for f in raw.layout_findings] == ["fps"]
    found = check_fps(raw)
    assert [f.check for f in found] == ["info.fps"]
    assert "fps must be a positive number" in found[0].message


def test_unknown_version_reads_as_v3_with_a_finding(tmp_path):
    root = rec40_with(tmp_path, lambda t: t.replace('"v3.0"', "3"))
    raw = read_raw(str(root))
    assert raw.version == "v3.0"
    assert [f.key for f in raw.layout_findings] == ["codebase_version"]
