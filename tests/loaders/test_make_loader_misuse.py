"""make_loader used the way a new user would (issue 38), each in a subprocess: a script without
``if __name__ == "__main__":``, a script on stdin, a plan made for another worker count, and a
worker that dies (its exit code and last stderr line, never a guess)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from episodekit.metadata.plans.build import ensure_plans
from episodekit.sample import write_sample

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is optional; these tests need it"
)
LINUX = sys.platform.startswith("linux")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = write_sample(tmp_path_factory.mktemp("misuse") / "root", episodes=8, seed=5, mean_length=40)
    ensure_plans(str(r), [1], 1)
    ensure_plans(str(r), [1], 2)
    return r


UNGUARDED = """
import sys
from episodekit.loaders.torch import make_loader

with make_loader(sys.argv[1] if len(sys.argv) > 1 else ROOT, None, 32, 2, access="random",
                 START) as loader:
    print("batches", sum(1 for _ in loader), flush=True)
"""


def script(root, start_method=None) -> str:
    start = "" if start_method is None else f"start_method={start_method!r}"
    return textwrap.dedent(UNGUARDED).replace("ROOT", repr(str(root))).replace("START", start)


def in_process_batches(root) -> int:
    from episodekit.loaders.torch import make_loader

    with make_loader(root, None, 32, 0, access="random") as loader:
        return sum(1 for _ in loader)


def run(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.skipif(not LINUX, reason="'fork' is Linux's (elsewhere: one line naming the fix)")
def test_a_script_without_main_guard_works(root, tmp_path):
    path = tmp_path / "train.py"
    path.write_text(script(root))
    r = run([sys.executable, str(path)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["batches", str(in_process_batches(root))]


@pytest.mark.skipif(not LINUX, reason="'fork' is Linux's (elsewhere: one line naming the fix)")
def test_a_script_on_stdin_works(root):
    r = run([sys.executable, "-"], input=script(root))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["batches", str(in_process_batches(root))]


def test_spawn_without_main_guard_is_one_line_naming_the_fix(root, tmp_path):
    path = tmp_path / "train.py"
    path.write_text(script(root, "spawn"))
    r = run([sys.executable, str(path)])
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("episodekit.loaders.workers.WorkerError: loader worker")
    assert "died (exit code 1)" in last and "its last stderr line: RuntimeError" in last
    assert 'put its top level under `if __name__ == "__main__":`' in last


DYING = """
import os, sys
from episodekit.loaders.sources import LoaderRun, RandomBatches
from episodekit.loaders.workers import BatchLoader


class Dying(RandomBatches):
    def batch(self, b):
        if b == 3:
            print("disk on fire at batch 3", file=sys.stderr, flush=True)
            os._exit(3)
        return super().batch(b)


if __name__ == "__main__":
    source = Dying(sys.argv[1], LoaderRun(batch_size=8), {}, {})
    for _ in BatchLoader(source, num_workers=2, start_method=sys.argv[2]):
        pass
"""


@pytest.mark.parametrize("method", ["fork", "spawn"] if LINUX else ["spawn"])
def test_a_dead_worker_gives_its_exit_code_and_last_stderr_line(root, tmp_path, method):
    path = tmp_path / "dying.py"
    path.write_text(textwrap.dedent(DYING))
    r = run([sys.executable, str(path), str(root), method])
    assert r.returncode == 1
    assert "disk on fire at batch 3" in r.stderr.splitlines()  # relayed as it came
    last = r.stderr.strip().splitlines()[-1]
    assert last.endswith("died (exit code 3); its last stderr line: disk on fire at batch 3"), last
    assert re.search(r"loader worker [01] \(pid ", last)  # whichever took batch 3


@pytest.mark.filterwarnings("ignore:make_loader. the plan is for 1 worker")
def test_a_plan_for_another_worker_count_is_streamed_without_reseeking(root, monkeypatch):
    """Worker 0 of 2 over a plan for 1 worker: every other batch of the one bin. The bin's
    order is built once and each row group decoded once (before: a new order per batch)."""
    import episodekit.loaders.sharded as sharded
    from episodekit.loaders import load_plan
    from episodekit.loaders.sources import LoaderRun, batch_source

    built = []

    class Counted(sharded.BinOrder):
        def __init__(self, *a, **k):
            built.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(sharded, "BinOrder", Counted)
    plan = load_plan(str(root), 1, 1)
    run_ = LoaderRun(batch_size=16, num_workers=2)
    ref = batch_source(root, plan, run_, {"cache_mb": 1})
    ref.open()
    n = ref.begin(ref.epoch_state(0))
    want = [ref.batch(b) for b in range(n)]
    built.clear()
    worker = batch_source(root, plan, run_, {"cache_mb": 1})
    worker.open()
    worker.begin(worker.epoch_state(0))
    got = [worker.batch(b) for b in range(0, n, 2)]
    assert len(built) == 1
    reader = worker.bins[0].frames.reader
    assert reader.row_groups_read <= len(reader.rg_start)
    for g, w in zip(got, want[::2]):
        np.testing.assert_array_equal(g["index"], w["index"])
        np.testing.assert_array_equal(g["action"], w["action"])


def test_make_loader_with_a_plan_for_one_worker_and_two_workers(root, tmp_path):
    """Same batches as in-process, and one warning line naming the command that writes the
    plan for 2 workers (pointing at the caller's line); a plan for 2 (or 1 worker over a plan
    for 2: each worker reads whole bins) says nothing."""
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        from episodekit.loaders import load_plan
        from episodekit.loaders.torch import make_loader

        if __name__ == "__main__":
            out = []
            for k, workers in ((1, 0), (1, 2), (2, 2), (2, 1)):
                plan = load_plan(sys.argv[1], 1, k)
                with make_loader(sys.argv[1], plan, 16, workers, copy=True) as loader:
                    out.append(np.concatenate([b["index"].numpy() for b in loader]))
            print(int(np.array_equal(out[0], out[1])), len(out[0]))
        """
    )
    path = tmp_path / "plan1.py"
    path.write_text(code)
    r = run([sys.executable, "-W", "always", str(path), str(root)])
    assert r.returncode == 0, r.stderr
    same, n = r.stdout.split()
    assert same == "1" and int(n) > 0
    said = [x for x in r.stderr.splitlines() if "Warning" in x]
    assert len(said) == 1, r.stderr
    head = f"{path}:11: UserWarning: make_loader: the plan is for 1 worker and num_workers=2, "
    assert said[0].startswith(head), said
    # (the sample's plans are made with --locality none: the hint keeps the plan's options)
    want = f"episodekit metadata plan {root} --world-size 1 --workers 2 --locality none"
    assert said[0].endswith(want), said


def test_a_mixture_plan_for_another_worker_count_names_its_mixture_command(tmp_path):
    from episodekit.loaders import load_plan
    from episodekit.loaders.sources import LoaderRun, batch_source
    from episodekit.metadata.mixture.plan import ensure_mixture_plans

    srcs = [write_sample(tmp_path / f"s{i}", episodes=6, seed=i, mean_length=20) for i in (1, 2)]
    spec = {"sources": [{"root": str(s), "weight": 1} for s in srcs]}
    folder = tmp_path / "plans"
    ensure_mixture_plans(spec, folder, [1], 2)
    plan = load_plan(folder, 1, 2)
    with pytest.warns(UserWarning) as said:
        batch_source(folder, plan, LoaderRun(batch_size=8, num_workers=3), {})
    assert len(said) == 1
    text = str(said[0].message)
    assert text.startswith("make_loader: the plan is for 2 workers and num_workers=3"), text
    assert text.endswith(f"--world-size 1 --workers 3 --out {folder} --locality none"), text
    assert "episodekit metadata plan --mixture " in text
