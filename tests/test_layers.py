"""The packages' import layers: no import cycles, and no layer imports one above it.

Every ``import`` of our modules counts, at the top of a file or inside a function (a lazy
import still ties two modules together). Layers, bottom up; a module may import its own
layer and the ones below it:

  scape               the optimizer library: imports nothing of ours
  data_prep           corpora -> prepared datasets
  eval                exported models, perplexity, lm-eval tasks
  pipelines.training  the runtime the pretrain stage drives
  pipelines.studies   the studies' internals
  pipelines           the stage modules (``python -m pipelines.<stage>``)
  benchmarks          may import everything
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("scape", "data_prep", "eval", "pipelines", "benchmarks")
LAYERS = (
    "scape",
    "data_prep",
    "eval",
    "pipelines.training",
    "pipelines.studies",
    "pipelines",
    "benchmarks",
)


def our_modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of ``packages`` under ``root``."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imported_names(module: str, path: Path, tree: ast.AST) -> list[str]:
    """Every dotted name an import statement of the file names (``from a import b``: a.b)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1 packages
                package = module.split(".")
                if path.name != "__init__.py":
                    package = package[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, *([node.module] if node.module else [])])
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports: for each imported name, the longest module
    it starts with (``from a import b`` is module a.b when there is one, else a)."""
    modules = our_modules(root, packages)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = set()
        for name in _imported_names(module, path, tree):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> ... -> a) for every group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_through(group, graph) for group in groups]


def _cycle_through(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """The shortest path from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle in {group}")  # pragma: no cover - a group has one


def layer_of(module: str, layers=LAYERS) -> int:
    """Index of the module's layer: its longest matching layer prefix."""
    matches = [
        (len(layer), i)
        for i, layer in enumerate(layers)
        if module == layer or module.startswith(layer + ".")
    ]
    return max(matches)[1]


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    return [
        f"{module} ({layers[layer_of(module, layers)]}) imports {target} "
        f"({layers[layer_of(target, layers)]}), a layer above it"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target, layers) > layer_of(module, layers)
    ]


def test_no_module_imports_a_module_that_imports_it_back():
    cycles = find_cycles(import_graph(REPO))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_layer_imports_one_above_it():
    upward = upward_imports(import_graph(REPO))
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_every_package_has_a_layer_and_the_walk_sees_the_rooms():
    graph = import_graph(REPO)
    for module in graph:
        layer_of(module)  # raises on a module outside every layer
    assert "pipelines.training.engine" in graph["pipelines.training.trainer"]
    assert "pipelines.studies.quality_run" in graph["pipelines.quality_study"]  # in a function


def test_the_check_catches_lazy_cycles_and_upward_imports(tmp_path):
    """The walker itself, on a made-up tree: a cycle through a function-level import, a
    relative import, and a lower layer importing an upper one."""
    files = {
        "low/__init__.py": "",
        "low/a.py": "from low import b\n",
        "low/b.py": "def f():\n    from .a import x\n",
        "low/c.py": "import high.stage\n",
        "high/__init__.py": "",
        "high/stage.py": "from low.c import y\nfrom low import a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ("low", "high"))
    assert graph["low.a"] == {"low.b"} and graph["low.b"] == {"low.a"}
    assert graph["high.stage"] == {"low.c", "low.a"}
    cycles = find_cycles(graph)
    assert sorted(map(tuple, cycles)) == [
        ("high.stage", "low.c", "high.stage"),
        ("low.a", "low.b", "low.a"),
    ]
    assert upward_imports(graph, ("low", "high")) == [
        "low.c (low) imports high.stage (high), a layer above it"
    ]
