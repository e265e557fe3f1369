"""The package's layering, as docs/architecture.md states it, held against the code's imports.

Reads the layer table of docs/architecture.md (bottom first) and every module of include/sluice, with every
import it makes: at the top, inside functions, under ``TYPE_CHECKING``. Fails when a module imports a layer
above its own, when modules import each other in a circle, when the window ledger is read or written outside
the windows layer, when code below the edge builds its own Spark session, engine or lake state, or when code
outside the storage layer tells a local lake from object storage.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "include" / "sluice"
DOC = ROOT / "docs" / "architecture.md"

#: Names that read or write ops/window_ledger directly: the windows layer's own.
LEDGER_ACCESS = {"read_ledger", "write_ledger", "_rows_of"}
#: What builds a run's resources: called only where a run starts (the edges), by the run context, and by the
#: storage layer that defines them.
RESOURCE_BUILDERS = {"get_spark", "engine_for", "lake_state"}
BUILDERS_ALLOWED = ("runtime", "edges", "storage")
#: Where the code may tell a local lake or landing zone from object storage.
LOCALITY_ALLOWED = ("sluice.core.lake",)


def layers(doc: str) -> dict[str, tuple[int, str]]:
    """Package -> (rank, layer name), from the table between the ``layers`` markers (bottom first)."""
    table = doc.split("<!-- layers:", 1)[1].split("<!-- /layers -->", 1)[0]
    out: dict[str, tuple[int, str]] = {}
    rows = [line for line in table.splitlines() if line.startswith("|") and not line.startswith("|---")][1:]
    for rank, row in enumerate(rows):
        name, packages = [cell.strip() for cell in row.strip("|").split("|")][:2]
        for package in re.findall(r"`([\w.]+)`", packages):
            out[package] = (rank, name)
    return out


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str, table: Mapping[str, tuple[int, str]]) -> tuple[int, str]:
    """The layer of the longest package the module lies in (``sluice`` itself only for the facade)."""
    found = [p for p in table if module == p or (p != "sluice" and module.startswith(p + "."))]
    if not found:
        raise AssertionError(f"{module} is in no layer of {DOC.name}: add its package to the table")
    return table[max(found, key=len)]


def imports(module: str, path: Path, known: Mapping[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported sluice module, line) for every import anywhere in the file."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sluice":
                    yield _resolve(alias.name, known), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != "sluice":
                continue
            for alias in node.names:
                # ``from sluice.x import y``: y may be a module of its own.
                sub = f"{base}.{alias.name}"
                yield (sub if sub in known else _resolve(base, known)), node.lineno


def _resolve(name: str, known: Mapping[str, Path]) -> str:
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def graph() -> dict[str, dict[str, int]]:
    known = modules()
    out: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        edges = out.setdefault(module, {})
        for target, line in imports(module, path, known):
            if target != module and target in known:
                edges.setdefault(target, line)
    return out


def upward_imports(edges: Mapping[str, Mapping[str, int]], table: Mapping[str, tuple[int, str]]) -> list[str]:
    found = []
    for source, targets in sorted(edges.items()):
        rank, name = layer_of(source, table)
        for target, line in sorted(targets.items()):
            target_rank, target_name = layer_of(target, table)
            # The facade hands the public API on, lazily: it may name the definitions' modules, which sit in
            # its own layer; nothing else in the package imports it.
            if target_rank > rank:
                found.append(f"{source}:{line} ({name}) imports {target} ({target_name}), a layer above")
    return found


def circles(edges: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def names_used(path: Path) -> Iterator[tuple[str, int]]:
    """Every name a module imports, references or calls, with its line."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.Name):
            yield node.id, node.lineno
        elif isinstance(node, ast.Attribute):
            yield node.attr, node.lineno


@pytest.fixture(scope="module")
def table() -> dict[str, tuple[int, str]]:
    return layers(DOC.read_text())


def test_every_module_is_in_a_layer_and_imports_only_its_own_or_lower_layers(table):
    assert [name for _rank, name in sorted(set(table.values()))][:2] == ["core", "config"]
    found = upward_imports(graph(), table)
    assert not found, "imports that run up a layer:\n" + "\n".join(found)


def test_no_module_imports_itself_through_others():
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_only_the_windows_layer_reads_or_writes_the_ledger_table(table):
    found = [f"{module}:{line} uses {name}"
             for module, path in modules().items() if layer_of(module, table)[1] != "windows"
             for name, line in names_used(path) if name in LEDGER_ACCESS]
    assert not found, "ledger access outside sluice.windows (use the run context's Ledger):\n" + "\n".join(found)


def test_below_the_edge_nothing_builds_a_session_an_engine_or_the_lake_state(table):
    found = [f"{module}:{line} uses {name}"
             for module, path in modules().items() if layer_of(module, table)[1] not in BUILDERS_ALLOWED
             for name, line in names_used(path) if name in RESOURCE_BUILDERS]
    assert not found, "built below the edge (take it from the RunContext instead):\n" + "\n".join(found)


def test_only_storage_tells_a_local_lake_from_object_storage(table):
    found = [f"{module}:{line} uses is_local"
             for module, path in modules().items()
             if layer_of(module, table)[1] != "storage" and module not in LOCALITY_ALLOWED
             for name, line in names_used(path) if name == "is_local"]
    assert not found, "branches on is_local outside sluice.storage (ask the lake or the store instead):\n" + "\n".join(
        found)


def test_the_checks_fail_on_a_violation(tmp_path, table):
    """The rules above are not vacuous: an upward import, a circle and a ledger read are each caught."""
    edges = {"sluice.core.windows": {"sluice.streaming.cycle": 1}, "sluice.streaming.cycle": {}}
    assert upward_imports(edges, table) == [
        "sluice.core.windows:1 (core) imports sluice.streaming.cycle (streaming), a layer above"]
    assert circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    module = tmp_path / "reader.py"
    module.write_text("def f(settings):\n    if True:\n        from sluice.windows.ledger import read_ledger\n"
                      "        return read_ledger(settings)\n")
    assert {name for name, _line in names_used(module)} & LEDGER_ACCESS == {"read_ledger"}
