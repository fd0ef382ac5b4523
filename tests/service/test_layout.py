"""The floor plan of ``service/`` holds: every module in a subpackage named for its job, no import
cycles (between modules or between subpackages, function-level imports included), the HTTP layer
imports no JAX, and the engine knows nothing of HTTP."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.imports import cycle, import_graph
from tests.helpers.service_helpers import REPO

SERVICE = REPO / "service"
SUBPACKAGES = {"http", "engine", "slice", "codecs", "cli"}
SHARED = {"__init__", "settings", "limits", "metrics", "problem", "client"}  # used by every subpackage
# Modules that import JAX when imported: the device side (loaded in the device thread) and the slice.
DEVICE_SIDE = {"vaeserve.service.engine.runner", "vaeserve.service.engine.sound", "vaeserve.service.engine.startup",
               "vaeserve.service.slice.member"}


def service_imports() -> dict[str, set[str]]:
    """``{module: service modules it imports}``, every import statement (top level or not)."""
    return import_graph(SERVICE)


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
