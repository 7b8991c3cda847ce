"""The code's layers, as a test: no module reaches into another's private names, nothing
outside the engine reads ``engine._...``, nothing below the CLI imports it, no import
cycles in the engine's and the batch job's modules, and modules stay a readable size."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "sluice"
MAX_LINES = 700
MAX_ENGINE_LINES = 500


TESTS = Path(__file__).resolve().parent


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def _modules_and_tests() -> Iterator[tuple[str, Path]]:
    """The package's modules, then the tests (which hold to the same rules)."""
    yield from _modules()
    for path in sorted(TESTS.glob("*.py")):
        yield path.stem, path


def _imports(name: str, path: Path) -> Iterator[tuple[str, str | None, int]]:
    """(module imported, name imported from it or None, line) for each import of ``path``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            module = f"{base}.{node.module}" if node.level and node.module else base if node.level else node.module
            for alias in node.names:
                yield module or "", alias.name, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno


def _type_only(path: Path) -> set[int]:
    """The lines of ``path``'s ``if TYPE_CHECKING:`` blocks (imports for annotations only)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def _runtime_imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(module, line) of each sluice module ``path`` imports when it runs: at import time or
    inside a function, not for annotations only. ``from pkg import module`` counts as the
    module."""
    names = {module for module, _ in _modules()}
    skip = _type_only(path)
    for module, imported, line in _imports(name, path):
        if module.startswith("sluice") and line not in skip:
            yield (f"{module}.{imported}" if f"{module}.{imported}" in names else module), line


def test_no_module_imports_another_modules_private_names() -> None:
    found = []
    for name, path in _modules_and_tests():
        for module, imported, line in _imports(name, path):
            if imported is None or not module.startswith("sluice") or imported == "*":
                continue
            private = imported.startswith("_") and not imported.startswith("__")
            is_module = (SRC.parent / module.replace(".", "/") / imported).with_suffix(".py").exists() or (
                SRC.parent / module.replace(".", "/") / imported / "__init__.py"
            ).exists()
            if private and not is_module:
                found.append(f"{path.relative_to(SRC.parent.parent)}:{line} imports {imported} from {module}")
    assert found == []


def test_nothing_outside_the_engine_reads_its_privates() -> None:
    pattern = re.compile(r"\bengine\._[a-z]")
    found = [
        f"{path.relative_to(SRC.parent.parent)}:{number}"
        for name, path in _modules_and_tests()
        if path.name not in ("_engine.py", "test_layers.py")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


#: Entry points beside the CLI (sluice inside other engines' pipelines): like the CLI they
#: read a job's sluice.toml, through the CLI's reader of it and nothing else of the CLI.
EDGES = ("sluice.pipelines", "sluice.ray", "sluice.dask")


def test_nothing_below_the_cli_imports_it() -> None:
    found = [
        f"{path.relative_to(SRC)}:{line} imports {module}"
        for name, path in _modules()
        if not name.startswith(("sluice.cli", "sluice._entry"))
        for module, _, line in _imports(name, path)
        if module.startswith("sluice.cli") and not (name.startswith(EDGES) and module == "sluice.cli._config")
    ]
    assert found == []


def test_nothing_but_the_edges_imports_the_pipeline_adapters() -> None:
    found = [
        f"{path.relative_to(SRC)}:{line} imports {module}"
        for name, path in _modules()
        if not name.startswith(("sluice.cli", *EDGES))
        for module, _, line in _imports(name, path)
        if module.startswith(EDGES)
    ]
    assert found == []


def _graph(prefixes: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules it imports at import time (not inside functions, not under
    TYPE_CHECKING), among those named by ``prefixes``."""
    names = {name for name, _ in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in _modules():
        if not name.startswith(prefixes):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in tree.body:  # top level only: an import inside a function runs later
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                module = f"{base}.{node.module}" if node.level and node.module else base if node.level else node.module
                for alias in node.names:
                    target = f"{module}.{alias.name}"
                    edges.add(target if target in names else str(module))
        graph[name] = {edge for edge in edges if edge.startswith(prefixes) and edge != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


@pytest.mark.parametrize("cluster", [("sluice._", "sluice.providers"), ("sluice.batch",), ("sluice.serve",)])
def test_no_import_cycle(cluster: tuple[str, ...]) -> None:
    assert _cycle(_graph(cluster)) is None


def test_modules_stay_a_readable_size() -> None:
    sizes = {
        path.relative_to(SRC).as_posix(): len(path.read_text(encoding="utf-8").splitlines()) for _, path in _modules()
    }
    assert {p: n for p, n in sizes.items() if n > MAX_LINES} == {}
    assert sizes["_engine.py"] < MAX_ENGINE_LINES


#: The values and their arithmetic: the bottom layer (docs/architecture.md).
VALUES = frozenset(
    f"sluice.{name}"
    for name in ("_models", "_errors", "_records", "_tokens", "_json", "_format", "_fastinit", "_schema")
)


def test_the_values_import_only_values() -> None:
    """Values sit below the features: ``Request.schema`` is a ``sluice._schema.Schema``, and
    ``sluice.structured`` (which asks, checks and re-asks with it) is above, not imported."""
    found = [
        f"{path.relative_to(SRC)}:{line} imports {module}"
        for name, path in _modules()
        if name in VALUES
        for module, line in _runtime_imports(name, path)
        if module not in VALUES and module != "sluice"
    ]
    assert found == []


#: The sub-packages of ``serve/`` and ``shapes/``, each with what of its package it may import
#: (the arrows point down; docs/architecture.md draws them). A new sub-package takes its
#: place here; the modules at a package's top level are above them all (``serve/_app.py``,
#: ``shapes/__init__.py``) or shared below them all (``SHARED``).
ARROWS = {
    "sluice.serve": {
        "core": (),
        "chat": ("core",),
        "embeddings": ("core",),
        "responses": ("core", "chat"),
        "messages": ("core", "chat"),
        "files": ("core",),
        "batches": ("core", "files"),
        "message_batches": ("core", "files", "batches", "messages"),
        "dashboard": ("core",),
    },
    "sluice.shapes": {"messages": (), "responses": ()},
}
SHARED = {"sluice.serve": (), "sluice.shapes": ("_common", "_fields")}


@pytest.mark.parametrize("package", sorted(ARROWS))
def test_sub_packages_import_only_downward(package: str) -> None:
    arrows, shared = ARROWS[package], SHARED[package]
    folder = SRC.parent / package.replace(".", "/")
    assert {p.name for p in folder.iterdir() if (p / "__init__.py").exists()} == set(arrows)
    names = {name for name, _ in _modules()}
    found = []
    for name, path in _modules():
        if not name.startswith(f"{package}."):
            continue
        here = name.removeprefix(f"{package}.").split(".")[0]
        for module, imported, line in _imports(name, path):  # for annotations too: an arrow is an arrow
            target = f"{module}.{imported}" if f"{module}.{imported}" in names else module
            if target != package and not target.startswith(f"{package}."):
                continue
            there = target.removeprefix(f"{package}.").split(".")[0] if target != package else "__init__"
            if here == there:
                continue
            if here in arrows:
                allowed = there in arrows[here] or there in shared
            else:
                allowed = here not in shared or there in shared
            if not allowed:
                found.append(f"{path.relative_to(SRC)}:{line} imports {target}")
    assert found == []
