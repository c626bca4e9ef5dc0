"""The numbers the code base holds itself to (docs/layout.md), measured from the source.

    .venv/bin/python scripts/house_metrics.py          # a table; exit 1 when a limit is broken

- modules over :data:`MAX_LINES` lines;
- modules importing ``pyarrow.parquet`` (at most :data:`MAX_PARQUET_MODULES`: the data-file
  layer in ``core/`` and the loaders' hot path);
- functions outside the CLI (``app/cli/``) taking :data:`MANY_PARAMS` or more parameters (at
  most :data:`MAX_MANY_PARAM_FUNCTIONS`: options travel in typed objects);
- classes with a metaclass in ``loaders/`` (none: one loader hierarchy, no dispatch by metaclass).

``tests/repo/test_house.py`` runs the same measurements.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "core", "prep", "metadata", "loaders", "validate", "writers", "sample")
MAX_LINES = 600
MAX_PARQUET_MODULES = 4
MANY_PARAMS = 10
MAX_MANY_PARAM_FUNCTIONS = 3


@dataclass
class Metrics:
    long_modules: list[tuple[str, int]] = field(default_factory=list)
    parquet_modules: list[str] = field(default_factory=list)
    many_param_functions: list[tuple[str, int]] = field(default_factory=list)
    metaclasses: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        out = [f"{m}: {n} lines (> {MAX_LINES})" for m, n in self.long_modules]
        if len(self.parquet_modules) > MAX_PARQUET_MODULES:
            out.append(
                f"{len(self.parquet_modules)} modules import pyarrow.parquet "
                f"(> {MAX_PARQUET_MODULES}): {', '.join(self.parquet_modules)}"
            )
        if len(self.many_param_functions) > MAX_MANY_PARAM_FUNCTIONS:
            names = ", ".join(f"{f} ({n})" for f, n in self.many_param_functions)
            out.append(
                f"{len(self.many_param_functions)} functions take >= {MANY_PARAMS} parameters "
                f"(> {MAX_MANY_PARAM_FUNCTIONS}): {names}"
            )
        out += [f"{c}: a metaclass in the loaders" for c in self.metaclasses]
        return out


def _n_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names = [n for n in names if n not in ("self", "cls")]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def _imports_parquet(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "pyarrow.parquet" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (
            node.module == "pyarrow.parquet"
            or (node.module == "pyarrow" and any(a.name == "parquet" for a in node.names))
        ):
            return True
    return False


def measure(repo: Path = REPO) -> Metrics:
    m = Metrics()
    for pkg in PACKAGES:
        for path in sorted((repo / pkg).rglob("*.py")):
            rel = path.relative_to(repo).as_posix()
            text = path.read_text()
            lines = text.count("\n")
            if lines > MAX_LINES:
                m.long_modules.append((rel, lines))
            tree = ast.parse(text)
            if _imports_parquet(tree):
                m.parquet_modules.append(rel)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = _n_params(node)
                    if n >= MANY_PARAMS and not rel.startswith("app/cli/"):
                        m.many_param_functions.append((f"{rel}:{node.name}", n))
                if pkg == "loaders" and isinstance(node, ast.ClassDef):
                    if any(k.arg == "metaclass" for k in node.keywords):
                        m.metaclasses.append(f"{rel}:{node.name}")
    return m


def main() -> int:
    m = measure()
    print(f"modules over {MAX_LINES} lines: {len(m.long_modules)}")
    for mod, n in sorted(m.long_modules, key=lambda x: -x[1]):
        print(f"  {n:5d}  {mod}")
    print(f"modules importing pyarrow.parquet: {len(m.parquet_modules)} (<= {MAX_PARQUET_MODULES})")
    for mod in m.parquet_modules:
        print(f"         {mod}")
    print(
        f"non-CLI functions with >= {MANY_PARAMS} parameters: {len(m.many_param_functions)} "
        f"(<= {MAX_MANY_PARAM_FUNCTIONS})"
    )
    for f, n in sorted(m.many_param_functions, key=lambda x: -x[1]):
        print(f"  {n:5d}  {f}")
    print(f"metaclasses in loaders/: {len(m.metaclasses)}")
    for c in m.metaclasses:
        print(f"         {c}")
    problems = m.problems()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
