"""The fault suite, counted for the Reproducibility page: how many cases ``tests/test_faults.py`` checks, per group.

Read statically (the page does not run the tests; the test command does): a group is a ``# ---- <name> ---`` heading
of the file, a case is a test function times the length of its ``pytest.mark.parametrize`` list (a literal list, or
``list(NAME)`` of a module-level dict or list literal).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

_GROUP = re.compile(r"^# ---- (.+?) -+$")


def _cases(fn: ast.FunctionDef, names: dict[str, int]) -> int:
    """The number of cases of one test function (1 unless parametrized)."""
    n = 1
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call) and ast.unparse(dec.func).endswith("mark.parametrize") and len(dec.args) > 1:
            values = dec.args[1]
            if isinstance(values, (ast.List, ast.Tuple)):
                n *= len(values.elts)
            elif isinstance(values, ast.Call) and isinstance(values.func, ast.Name) and values.func.id == "list" \
                    and values.args and isinstance(values.args[0], ast.Name):
                n *= names.get(values.args[0].id, 1)
    return n


def fault_cases(path: str | Path) -> dict[str, int]:
    """Cases per group of a fault-suite file, in file order."""
    source = Path(path).read_text(encoding="utf-8")
    tree = ast.parse(source)
    names = {t.id: len(node.value.keys if isinstance(node.value, ast.Dict) else node.value.elts)
             for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Dict, ast.List))
             for t in node.targets if isinstance(t, ast.Name)}
    starts = [(i + 1, m.group(1)) for i, line in enumerate(source.splitlines()) if (m := _GROUP.match(line))]
    out: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            group = next((g for line, g in reversed(starts) if line < node.lineno), "other")
            out[group] = out.get(group, 0) + _cases(node, names)
    return out


def fault_summary(path: str | Path) -> str:
    """One line: the suite's case count and its groups, or why there is none (e.g. an installed wheel)."""
    path = Path(path)
    if not path.exists():
        return f"*The fault suite ({path.name}) is not in this installation; it ships with the repository.*"
    cases = fault_cases(path)
    groups = "; ".join(f"{g} {n}" for g, n in cases.items())
    return (f"**Fault suite**: {sum(cases.values())} cases in `tests/{path.name}`, checked by the test command "
            f"({groups}).")


__all__ = ["fault_cases", "fault_summary"]
