"""The floor plan of ``service/`` holds: every module in a subpackage named for its job, no import
cycles (between modules or between subpackages, function-level imports included), the HTTP layer
imports no JAX, and the engine knows nothing of HTTP."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.helpers.service_helpers import REPO

SERVICE = REPO / "service"
SUBPACKAGES = {"http", "engine", "slice", "codecs", "cli"}
SHARED = {"__init__", "settings", "limits", "metrics", "problem", "client"}  # used by every subpackage
# Modules that import JAX when imported: the device side (loaded in the device thread) and the slice.
DEVICE_SIDE = {"vaeserve.service.engine.runner", "vaeserve.service.engine.startup", "vaeserve.service.slice.member"}


def module_name(path: Path) -> str:
    parts = ("vaeserve", *path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def service_imports() -> dict[str, set[str]]:
    """``{module: service modules it imports}``, every import statement (top level or not)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(SERVICE.rglob("*.py")):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            found |= {t for t in targets if t.startswith("vaeserve.service")}
        graph[name] = found
    modules = set(graph)
    return {name: {t for t in targets if t in modules and t != name} for name, targets in graph.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
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


def subpackage(module: str) -> str:
    """The subpackage a module belongs to; ``entry`` for the package itself and ``__main__`` (they
    import the app and the command line), ``shared`` for settings, limits, metrics, problem, client."""
    parts = module.split(".")[1:]  # without "vaeserve."
    if parts == ["service"]:
        return "entry"
    return parts[1] if len(parts) > 2 or parts[1] in SUBPACKAGES else "shared"


def test_every_module_sits_in_a_subpackage_named_for_its_job():
    loose = {p.stem for p in SERVICE.glob("*.py")} - SHARED
    assert not loose, f"service modules outside a subpackage: {sorted(loose)}"
    assert {p.name for p in SERVICE.iterdir() if (p / "__init__.py").exists()} == SUBPACKAGES


def test_no_import_cycles_between_modules_or_subpackages():
    graph = service_imports()
    assert cycle(graph) is None, cycle(graph)
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        packages.setdefault(subpackage(module), set()).update(subpackage(t) for t in targets)
    packages = {name: targets - {name} for name, targets in packages.items()}
    assert cycle(packages) is None, cycle(packages)
    # The engine knows nothing of HTTP, the slice or the command line; the codecs (bytes and
    # arrays) nothing of HTTP or the engine.
    assert packages["engine"] <= {"shared"}, packages["engine"]
    assert packages["codecs"] <= {"shared"}, packages["codecs"]
    assert "http" not in packages["slice"]
    # Negative control: the checker sees a cycle when there is one.
    assert cycle({**graph, "vaeserve.service.engine.errors": {"vaeserve.service.http.problems"}}) is not None


def test_no_imports_hidden_under_type_checking():
    hidden = [str(p.relative_to(REPO)) for p in SERVICE.rglob("*.py") if "TYPE_CHECKING" in p.read_text()]
    assert not hidden, hidden


def test_the_http_layer_imports_no_jax():
    """Everything but the device side, imported in a fresh interpreter: JAX stays out, so the
    server answers /healthz while the device thread imports it and loads the model."""
    modules = sorted(m for m in service_imports() if m not in DEVICE_SIDE and not m.endswith("__main__"))
    assert "vaeserve.service.http.app" in modules and "vaeserve.service.cli" in modules
    code = ("import importlib, sys\n"
            f"for name in {modules!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    # Negative control: the device side does import it.
    code = "import sys, vaeserve.service.engine.runner; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
