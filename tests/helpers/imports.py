"""The import graph of a package folder, read from its source (every import statement, top level or
not): what the layout tests hold to their floor plans."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.service_helpers import REPO


def module_name(path: Path) -> str:
    """``models/families/wan/__init__.py`` -> ``vaeserve.models.families.wan``."""
    parts = ("vaeserve", *path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module name a file's import statements name (``from a import b`` names ``a`` and ``a.b``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def import_graph(folder: Path) -> dict[str, set[str]]:
    """``{module: modules of the same folder it imports}``; the packages a module sits in are left
    out (importing any module runs its packages' ``__init__`` first: not an edge of its own)."""
    files = {module_name(p): p for p in sorted(folder.rglob("*.py"))}
    return {name: {t for t in imported(path) if t in files and t != name and not name.startswith(t + ".")}
            for name, path in files.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import circle of ``graph`` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None
