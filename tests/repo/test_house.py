"""The house's limits (docs/layout.md) hold: no module over 600 lines, ``pyarrow.parquet``
imported only by the data-file layer and the loaders' hot path, options in typed objects (few
functions with ten or more parameters), no loader dispatch by metaclass. Measured by
``scripts/house_metrics.py``, the same script a contributor runs."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _metrics_module():
    spec = importlib.util.spec_from_file_location(
        "house_metrics", REPO / "scripts/house_metrics.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


def test_the_house_holds_its_limits():
    hm = _metrics_module()
    assert hm.measure(REPO).problems() == []


def test_the_measurements_catch_each_breach(tmp_path):
    """A repository that breaks each limit once is reported for each (the check can fail)."""
    hm = _metrics_module()
    for pkg in hm.PACKAGES:
        (tmp_path / pkg).mkdir()
    (tmp_path / "core/long.py").write_text("x = 1\n" * (hm.MAX_LINES + 1))
    for i in range(hm.MAX_PARQUET_MODULES + 1):
        (tmp_path / f"prep/pq{i}.py").write_text("import pyarrow.parquet as pq\n")
    params = ", ".join(f"a{i}" for i in range(hm.MANY_PARAMS))
    body = "".join(
        f"def f{i}({params}):\n    pass\n" for i in range(hm.MAX_MANY_PARAM_FUNCTIONS + 1)
    )
    (tmp_path / "metadata/many.py").write_text(body)
    (tmp_path / "loaders/meta.py").write_text(
        textwrap.dedent("""
        class M(type):
            pass
        class L(metaclass=M):
            pass
        """)
    )
    problems = hm.measure(tmp_path).problems()
    assert any("core/long.py" in p for p in problems)
    assert any("import pyarrow.parquet" in p for p in problems)
    assert any("parameters" in p for p in problems)
    assert any("metaclass" in p for p in problems)
