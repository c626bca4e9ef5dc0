"""The registry of prepare's steps and artifacts (``episodekit.prepare_steps.STEPS``): every
step declares its artifacts, and a step added there alone is run, summarized, keyed in the
validation stamp and replayed by the stamp-only rerun (nothing else names it)."""

from __future__ import annotations

import json
import os

import pytest

import episodekit.prepare_steps as registry
from episodekit.core.paths import STAMP_FILE
from episodekit.prepare import format_result, prepare
from episodekit.prepare_base import Artifact, Ensured, PrepareStep

EXTRA = "meta/extra_artifact.json"


class Extra(PrepareStep):
    """A made-up artifact: written once, then fresh (its key: the root's episode count)."""

    name = "extra"
    artifacts = (Artifact("extra", (EXTRA,), "episode count"),)

    def ensure(self, ctx) -> Ensured:
        path = ctx.work / EXTRA
        key = {"episodes": ctx.ds.num_episodes}
        if path.is_file() and json.loads(path.read_text()) == key:
            return Ensured("skipped", {"episodes": key["episodes"]}, [])
        path.write_text(json.dumps(key))
        return Ensured("done", {"episodes": key["episodes"]}, [EXTRA])

    def summary(self, step) -> str:
        return f"{step.detail['episodes']} episodes"

    def rerun_detail(self, step) -> dict | None:
        return step.detail


def test_every_step_declares_its_artifacts_and_the_stamp_keys_on_them():
    names = [s.name for s in registry.STEPS]
    assert len(names) == len(set(names))
    assert registry.verdict_steps() == ("validate", "frames")
    owners = {a.name: s.name for s in registry.STEPS for a in s.artifacts}
    assert owners == {
        "speed percentiles": "speed",
        "episode costs": "costs",
        "shard plans": "plans",
        "canonical plan": "plans",
        "stats": "stats",
        "validation stamp": "validate",
        "frame store": "frames",
    }
    assert all(a.key for s in registry.STEPS for a in s.artifacts)
    stamped = registry.stamped_globs()
    for s in registry.STEPS:
        for a in s.artifacts:
            assert all((p in stamped) == a.stamped for p in a.paths), a.name


def test_a_step_added_to_the_registry_alone_is_run_stamped_and_replayed(make_sample, monkeypatch):
    steps = list(registry.STEPS)
    steps.insert(steps.index(registry.STEPS[6]), Extra())  # before validation
    monkeypatch.setattr(registry, "STEPS", tuple(steps))
    root = make_sample(episodes=12)
    kw = {"world_sizes": (2,), "num_workers": 2, "jobs": 1}

    first = prepare(str(root), **kw)
    assert first.ok and first.step("extra").status == "done"
    assert EXTRA in first.changed and "extra" in format_result(first)
    stamp = json.loads((root / STAMP_FILE).read_text())
    assert stamp["rerun"]["details"]["extra"] == {"episodes": 12}

    again = prepare(str(root), **kw)  # the stamp-only rerun replays the new step too
    assert again.ok and [s.status for s in again.steps] == ["skipped"] * len(again.steps)
    assert again.step("extra").detail == {"episodes": 12}

    st = os.stat(root / EXTRA)  # the stamp keys on the new artifact: validated again
    os.utime(root / EXTRA, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third = prepare(str(root), **kw)
    assert third.ok and third.step("validate").detail.get("fresh_stamp") is None
    assert third.step("extra").status == "skipped"


def test_a_failed_rewrite_stops_the_run_and_no_verdict_is_given(make_sample, monkeypatch):
    """The runner reads ``stops_on_failure`` and ``verdict`` from the steps, not their names."""

    class Broken(Extra):
        name = "broken"
        stops_on_failure = True

        def ensure(self, ctx) -> Ensured:
            return Ensured("failed", {"why": "made up"}, [])

        def summary(self, step) -> str:
            return step.detail["why"]

    steps = list(registry.STEPS)
    steps.insert(2, Broken())  # after the rewrites
    monkeypatch.setattr(registry, "STEPS", tuple(steps))
    root = make_sample(episodes=12)
    r = prepare(str(root), world_sizes=(2,), num_workers=2, jobs=1)
    assert not r.ok and [s.name for s in r.steps] == ["rowgroups", "broken"]
    assert "prepare FAILED at step broken" in format_result(r)


@pytest.mark.parametrize("value", [0, -1, float("inf")])
def test_target_mb_is_checked_once_where_the_options_are_parsed(make_sample, value):
    root = make_sample(episodes=4)
    with pytest.raises(ValueError, match="target_mb must be > 0 and <="):
        prepare(str(root), target_mb=value)
