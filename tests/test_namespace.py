"""One package, ``vaeserve``: its API imports without JAX, every module loads under one name, and the
checkout's folders refuse to load under their bare names (``models``, ``service``, ``sharding``),
which would load every module a second time and shadow a user's own packages."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.service_helpers import REPO

SUBPACKAGES = ("models", "sharding", "service")


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_import_vaeserve_gives_the_api_without_jax():
    code = ("import sys, vaeserve\n"
            "print('jax' in sys.modules)\n"
            "print(all(callable(getattr(vaeserve, name)) or name in vaeserve.__all__ for name in vaeserve.__all__))\n"
            "print(vaeserve.load_vae.__module__, vaeserve.make_mesh.__module__, vaeserve.create_app.__module__)\n")
    done = python(code)
    assert done.returncode == 0, done.stderr
    no_jax, resolved, modules = done.stdout.splitlines()
    assert no_jax == "False" and resolved == "True"
    assert modules == "vaeserve.models.loading vaeserve.sharding.mesh vaeserve.service.http.app"


def test_every_module_loads_once_under_the_vaeserve_name():
    code = ("import importlib, pkgutil, sys, vaeserve\n"
            "for package in ('models', 'sharding', 'service'):\n"
            "    root = importlib.import_module(f'vaeserve.{package}')\n"
            "    for info in pkgutil.walk_packages(root.__path__, root.__name__ + '.'):\n"
            "        importlib.import_module(info.name)\n"
            "real = __import__('os').path.realpath\n"
            "ours = {n: real(m.__file__) for n, m in sys.modules.items() if getattr(m, '__file__', None)\n"
            "        and real(m.__file__).startswith(tuple(sys.argv[1:]))}\n"
            "print(len(ours))\n"
            "print(sorted(n for n in ours if not n.startswith('vaeserve')))\n"
            "print(len(ours) - len(set(ours.values())))\n")
    folders = [f"{REPO / name}/" for name in (*SUBPACKAGES, "vaeserve")]
    done = subprocess.run([sys.executable, "-c", code, *folders], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    count, foreign, twice = done.stdout.splitlines()
    modules = [p for name in SUBPACKAGES for p in (REPO / name).rglob("*.py")] + [REPO / "vaeserve/__init__.py"]
    modules += (REPO / "vaeserve/client").rglob("*.py")  # the client, a folder of its own (service.client loads it)
    assert int(count) == len(modules) and foreign == "[]" and twice == "0", done.stdout


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_a_bare_folder_name_is_refused(package):
    done = python(f"import {package}")
    assert done.returncode != 0
    assert f"import it as `vaeserve.{package}`" in done.stderr
    # The control: the same folder under its package name imports.
    assert python(f"import vaeserve.{package}").returncode == 0
