"""The layering of DESIGN.md holds: core at the ground, validate on top, no cycles, no guarded
imports of our own modules, and the runtime / CLI entry points stay light."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDERS = {  # folder -> layer (package)
    "core": "core",
    "prep": "prep",
    "metadata": "metadata",
    "loaders": "loaders",
    "validate": "validate",
    "writers": "writers",
    "sample": "sample",
    "importers": "importers",
    "app": "top",
}
ALLOWED = {
    "core": {"core"},
    "prep": {"core", "prep"},
    "metadata": {"core", "metadata"},
    "loaders": {"core", "metadata", "loaders"},
    "validate": {"core", "prep", "metadata", "validate"},
    # writers (episodekit.writers): new datasets from old ones (edit, split, merge, convert,
    # repair), with LeRobot's stats and validation's findings: above validate, below the app
    "writers": {"core", "prep", "metadata", "validate", "importers", "writers"},
    # sample (episodekit.sample): synthetic LeRobot datasets, the test data of tests, demo and
    # benchmarks; data files through the episode sink's (writers.sink_data), stats LeRobot's
    # way (metadata)
    "sample": {"core", "metadata", "writers", "sample"},
    # importers (episodekit.importers): readers of other formats (RLDS, HDF5, zarr, ROS bags)
    # and the import map; on core only (the writers' import pipeline feeds them to the sink)
    "importers": {"core", "importers"},
    "top": set(FOLDERS.values()),
}
GUARD_ERRORS = {"ImportError", "ModuleNotFoundError"}


def layer_of_module(name: str) -> str | None:
    """Layer of an absolute module name (None: not ours)."""
    parts = name.split(".")
    if parts[0] != "episodekit":
        return None
    if len(parts) > 1 and parts[1] in FOLDERS.values() and parts[1] != "top":
        return parts[1]
    return "top"


def package_of(path: Path) -> str:
    """The package relative imports resolve against (prep/rewrite.py -> episodekit.prep)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    head = ["episodekit"] if parts[0] == "app" else ["episodekit", parts[0]]
    return ".".join(head + parts[1:-1])


def imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in the tree, relative ones resolved."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names if mod == "episodekit"]
    return out


def guarded_own_imports(tree: ast.AST, package: str) -> list[int]:
    """Lines of episodekit imports inside a ``try`` that catches ImportError."""
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        caught = set()
        for h in node.handlers:
            names = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
            caught |= {n.id for n in names if isinstance(n, ast.Name)}
        if not caught & GUARD_ERRORS:
            continue
        for stmt in node.body:
            for line, mod in imported_modules(stmt, package):
                if layer_of_module(mod):
                    bad.append(line)
    return bad


def violations(source: str, layer: str, package: str, where: str) -> list[str]:
    tree = ast.parse(source)
    out = []
    for line, mod in imported_modules(tree, package):
        target = layer_of_module(mod)
        if target is not None and target not in ALLOWED[layer]:
            out.append(f"{where}:{line}: {layer} imports {mod} ({target})")
    out += [
        f"{where}:{line}: guarded import of episodekit"
        for line in guarded_own_imports(tree, package)
    ]
    return out


def our_files() -> list[tuple[Path, str]]:
    files = []
    for folder, layer in FOLDERS.items():
        files += [(p, layer) for p in sorted((REPO / folder).rglob("*.py"))]
    return files


def test_layers_import_only_downward():
    problems = []
    for path, layer in our_files():
        problems += violations(
            path.read_text(), layer, package_of(path), str(path.relative_to(REPO))
        )
    assert problems == []


def test_no_cycles_between_folders():
    edges: dict[str, set[str]] = {layer: set() for layer in ALLOWED}
    for path, layer in our_files():
        for _, mod in imported_modules(ast.parse(path.read_text()), package_of(path)):
            target = layer_of_module(mod)
            if target and target != layer:
                edges[layer].add(target)
    seen: dict[str, int] = {}

    def visit(n: str, stack: list[str]) -> None:
        assert seen.get(n) != 1, f"cycle: {' -> '.join(stack + [n])}"
        if seen.get(n) == 2:
            return
        seen[n] = 1
        for m in edges[n]:
            visit(m, stack + [n])
        seen[n] = 2

    for n in edges:
        visit(n, [])


@pytest.mark.parametrize(
    "layer, source, expect",
    [
        ("core", "from episodekit.metadata.costs import COST_FILE\n", "core imports"),
        ("metadata", "from episodekit.loaders import FrameDataset\n", "metadata imports"),
        ("prep", "from episodekit import __version__\n", "prep imports"),
        ("loaders", "from ..validate import runner\n", "loaders imports"),
        (
            "validate",
            "try:\n    from episodekit.prep import band\nexcept ImportError:\n    band = None\n",
            "guarded import",
        ),
        ("loaders", "from episodekit.core.dataset import Dataset\n", None),
        ("prep", "from episodekit.writers import writer\n", "prep imports"),
        ("writers", "from episodekit.loaders import FrameDataset\n", "writers imports"),
        ("writers", "from episodekit.validate.runner import validate\n", None),
    ],
)
def test_the_checker_catches_violations(layer, source, expect):
    """The walker itself: each bad shape is reported, a good import is not."""
    package = f"episodekit.{layer}"
    found = violations(source, layer, package, "x.py")
    assert (expect is None and found == []) or any(expect in f for f in found), found


HEAVY = ("polars", "duckdb", "click", "huggingface_hub", "pyarrow", "numpy", "torch")


def loaded_after(code: str) -> list[str]:
    probe = (
        code + f"\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_loader_import_is_light():
    loaded = loaded_after("import episodekit.loaders")
    assert not set(loaded) & {"polars", "duckdb", "click", "huggingface_hub", "torch"}, loaded


def test_cli_help_and_version_import_no_data_libraries():
    for args in (["--help"], ["--version"]):
        code = (
            "import sys\nfrom episodekit.cli import main\n"
            f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        )
        loaded = loaded_after(code)
        assert not set(loaded) & {"pyarrow", "polars", "duckdb", "numpy"}, (args, loaded)


def module_name(path: Path) -> str:
    """Absolute module name of one of our files (app/cli/common.py -> episodekit.cli.common)."""
    pkg = package_of(path)
    return pkg if path.name == "__init__.py" else f"{pkg}.{path.stem}"


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (never executed: no import at run time)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skip |= {id(n) for n in ast.walk(stmt)}
    return skip


def module_graph() -> dict[str, set[str]]:
    """Module -> our modules it imports anywhere in its body, functions included."""
    files = {module_name(p): p for p, _ in our_files()}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        skip = type_checking_nodes(tree)
        deps = set()
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for _, mod in imported_modules(node, package_of(path)):
                while mod and mod not in files:  # a name imported from a module
                    mod = mod.rpartition(".")[0]
                if mod and mod != name:
                    deps.add(mod)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_import_cycles_counting_imports_inside_functions():
    """An import inside a function hides a cycle from Python, not from the design."""
    assert cycles(module_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


MAX_FUNCTION_LINES = 100


def test_no_function_over_100_lines():
    long = []
    for path, _ in our_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert long == []
