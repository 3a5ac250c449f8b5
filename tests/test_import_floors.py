"""Imports run down: the library's floors, written once here, and the test that holds every module of ``lib/lmdepth``
to them.

A module imports only from its own floor or the floors below it, and no two modules import each other, directly or
round a circle. Every import counts: at module level, inside functions, and under ``if TYPE_CHECKING:``. README's
layout section and ``docs/ARCHITECTURE.md`` name the same floors in the same order (checked below too).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib"

#: The floors, bottom up. ``ground`` holds the top-level modules (and the package itself); every other floor is the
#: sub-package of the same name.
FLOORS = ("ground", "kernels", "metrics", "data", "model", "hooks", "traces", "scratch", "claims", "analyses", "charts", "book")
#: The modules of the ground floor: exceptions, parameters, runtime, results; ``testing`` builds the tests' tiny
#: models from transformers alone.
GROUND = ("errors", "params", "runtime", "results", "testing")

#: Imports from a higher floor or inside a circle allowed for now, as (importer, imported) module pairs, each with
#: its reason. An entry that no longer matches an import fails the test, so the set only shrinks.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(LIB).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((LIB / "lmdepth").rglob("*.py"))}


def floor_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and parts[1] in GROUND):
        return "ground"
    return parts[1] if parts[1] in FLOORS[1:] else None


def imports_of(module: str) -> list[tuple[str, int]]:
    """(imported lmdepth module, line) for every import statement of ``module``, wherever it stands.

    ``from a.b import c`` names the module ``a.b.c`` when that is a module, else ``a.b``.
    """
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found += [(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base, node.lineno)
                      for a in node.names]
    return sorted({(m, line) for m, line in found if m == "lmdepth" or m.startswith("lmdepth.")},
                  key=lambda t: (t[1], t[0]))


GRAPH = {m: imports_of(m) for m in MODULES}


def where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def upward_imports() -> list[tuple[str, str, str]]:
    """(importer, imported, one line saying so) for each import from a higher floor."""
    out = []
    for module, imports in GRAPH.items():
        mine = FLOORS.index(floor_of(module))
        for target, line in imports:
            theirs = floor_of(target)
            if theirs is not None and FLOORS.index(theirs) > mine:
                out.append((module, target, f"{where(module, line)}: {module} (floor {floor_of(module)}) imports "
                                            f"{target} (floor {theirs}, above it)"))
    return out


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (recursive; the graph is ~100 modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def shortest_cycle(graph: dict[str, set[str]], start: str) -> list[str]:
    """The shortest circle of imports from ``start`` back to it (breadth first)."""
    before: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(before[path[-1]])
                return [*reversed(path), start]
            if w not in before:
                before[w] = v
                queue.append(w)
    return []


def import_cycles() -> list[tuple[list[tuple[str, str]], str]]:
    """(the circle's import pairs, one line naming it with the line of each import) per circle of modules."""
    graph = {m: {t for t, _ in imports if t in MODULES and t != m} for m, imports in GRAPH.items()}
    out = []
    for comp in strongly_connected(graph):
        if len(comp) < 2:
            continue
        cycle = shortest_cycle({m: graph[m] & set(comp) for m in comp}, comp[0])
        pairs = list(zip(cycle, cycle[1:]))
        lines = [min(line for t, line in GRAPH[a] if t == b) for a, b in pairs]
        extra = f"; {len(comp)} modules are in the circle: {', '.join(comp)}" if len(comp) > len(cycle) - 1 else ""
        out.append((pairs, "import cycle: " + " → ".join(cycle) + " ("
                    + ", ".join(where(a, line) for (a, _), line in zip(pairs, lines)) + ")" + extra))
    return out


def test_every_module_stands_on_a_floor():
    lost = [m for m in MODULES if floor_of(m) is None]
    assert not lost, f"modules on no floor (add their package to FLOORS in {Path(__file__).name}): {lost}"


def test_imports_run_down_and_never_in_a_circle():
    upward = [(a, b, msg) for a, b, msg in upward_imports() if (a, b) not in KNOWN_EXCEPTIONS]
    cycles = [msg for pairs, msg in import_cycles() if not any(p in KNOWN_EXCEPTIONS for p in pairs)]
    problems = [msg for _, _, msg in upward] + cycles
    if problems:
        pytest.fail(f"{len(upward)} import(s) from a higher floor, {len(cycles)} import cycle(s) "
                    f"(floors, bottom up: {' → '.join(FLOORS)}):\n" + "\n".join(problems), pytrace=False)


def test_the_kernels_import_torch_and_the_standard_library_only():
    """The kernels travel by value with a remote request (``nnsight.register``): an import from the rest of the
    library would have to travel too, or fail on the server."""
    import sys

    kernels = [m for m in MODULES if floor_of(m) == "kernels"]
    assert kernels, "lmdepth.kernels is gone"
    bad = []
    for module in kernels:
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or "."] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{where(module, node.lineno)}: {n}" for n in names
                    if n.split(".")[0] not in {"torch", "__future__"} | set(sys.stdlib_module_names)
                    and not n.startswith("lmdepth.kernels")]
    assert not bad, "the kernels may import torch, the standard library and each other only:\n" + "\n".join(bad)


def test_known_exceptions_are_still_needed():
    seen = {(a, b) for a, b, _ in upward_imports()} | {p for pairs, _ in import_cycles() for p in pairs}
    stale = sorted(set(KNOWN_EXCEPTIONS) - seen)
    assert not stale, f"KNOWN_EXCEPTIONS entries no import needs any more (remove them): {stale}"


FLOOR_LINE = f"ground ({', '.join(m + '.py' for m in GROUND)}) → " + " → ".join(FLOORS[1:])


@pytest.mark.parametrize("doc", ["README.md", "docs/ARCHITECTURE.md"])
def test_the_docs_name_the_same_floors(doc):
    text = " ".join((ROOT / doc).read_text().replace("`", "").split())
    assert FLOOR_LINE in text, f"{doc} should name the floors, bottom up, as: {FLOOR_LINE}"


def test_no_two_modules_share_a_file_name():
    """A traceback's file name says which job failed: ``analyses/lens.py`` and ``claims/lens_claims.py``, never two
    ``lens.py`` (docs/ARCHITECTURE.md, "Names say the job")."""
    by_name: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(module)
    shared = {name: mods for name, mods in by_name.items() if len(mods) > 1}
    assert not shared, f"modules that share a file name (rename by job, see docs/ARCHITECTURE.md): {shared}"
