"""The wheel as users install it: ``python -m build`` (an sdist, then the wheel built from it), a
fresh virtual environment outside the checkout, a plain (not editable) install, every module of
the wheel imported from it, and ``vaeserve serve`` started from a folder that is not the checkout,
decoding once over HTTP and exiting 0 on SIGTERM. The wheel installs one top-level package,
``vaeserve``: run from a user's project that has its own ``models/``, ``service.py`` and
``sharding.py``, the API, ``python -m vaeserve`` and the console script still import ours.

The wheel's dependencies come from a folder of downloaded wheels kept between runs in the user's
cache (``pip download`` fetches only what it lacks), so a run does not download JAX again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.image_helpers import REPO, Running, wait_ready
from tests.helpers.service_helpers import LATENT, free_port, latents
from vaeserve.service.client import decode

PACKAGES = ("models", "sharding", "service")  # the checkout's folders, vaeserve.* installed
WHEEL_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vaeserve-tests" / "wheels"


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stdout[-3000:]}\n" \
                                 f"{done.stderr[-3000:]}"
    return done


def user_env() -> dict[str, str]:
    """This environment less what points Python or JAX at the checkout or at the test set-up."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "XLA_", "JAX_", "VAESERVE_"))}


def checkout_modules() -> set[str]:
    """Every Python file git tracks in the three packages and in ``vaeserve/``, as a path inside a
    wheel (``models/x.py`` -> ``vaeserve/models/x.py``)."""
    listed = run(["git", "-C", str(REPO), "ls-files", "--", "vaeserve/*.py", *[f"{p}/*.py" for p in PACKAGES]]).stdout
    return {path if path.startswith("vaeserve/") else f"vaeserve/{path}" for path in listed.split()}


def missing_from(archive_names: list[str], expected: set[str], prefix: str = "") -> list[str]:
    """The expected files an archive lacks (``prefix``: the folder an sdist keeps them under)."""
    return sorted(expected - {name.removeprefix(prefix) for name in archive_names})


def module_names(paths: list[str]) -> list[str]:
    """``vaeserve/service/http/routes/decode.py`` → ``vaeserve.service.http.routes.decode``; ``__main__`` modules are left out
    (importing one runs the program)."""
    names = []
    for path in sorted(paths):
        parts = path.removesuffix(".py").split("/")
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], env=user_env(), timeout=600)
    (sdist,) = out.glob("vaeserve-*.tar.gz")
    (wheel,) = out.glob("vaeserve-*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A new virtual environment (no system site-packages) with the wheel and its dependencies."""
    env_dir = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", str(env_dir)], env=user_env())
    pip = [str(env_dir / "bin/python"), "-m", "pip", "--disable-pip-version-check"]
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    run([*pip, "download", "--quiet", "--dest", str(WHEEL_CACHE), str(dist["wheel"])], env=user_env(), timeout=900)
    for copied in WHEEL_CACHE.glob("vaeserve-*"):  # pip download keeps the wheel itself too
        copied.unlink()
    run([*pip, "install", "--quiet", "--no-index", "--find-links", str(WHEEL_CACHE), str(dist["wheel"])],
        env=user_env(), timeout=900)
    return env_dir


def test_sdist_and_wheel_hold_every_module(dist):
    expected = checkout_modules()
    assert {"vaeserve/__init__.py", "vaeserve/__main__.py", "vaeserve/service/http/routes/decode.py",
            "vaeserve/service/cli/serve.py", "vaeserve/models/loading.py"} <= expected
    wheel_names = zipfile.ZipFile(dist["wheel"]).namelist()
    assert missing_from(wheel_names, expected) == []
    # Package data: the pages of /ui, /docs and /redoc, their scripts, styles and vendored licences,
    # and the compiled plans.
    static = {f"vaeserve/{path.relative_to(REPO).as_posix()}" for path in (REPO / "service/http/static").rglob("*")
              if path.is_file()}
    assert {"vaeserve/service/http/static/ui.html", "vaeserve/service/http/static/app.js",
            "vaeserve/service/http/static/app.css", "vaeserve/service/http/static/docs/assets/swagger-ui/LICENSE"} <= static
    assert sorted(static - set(wheel_names)) == []
    assert {"vaeserve/sharding/plans/tpu.jsonl", "vaeserve/sharding/plans/gpu.jsonl"} <= set(wheel_names)
    # One top-level name: a user's own models/, service/ or sharding/ is never overwritten or shadowed.
    assert {name.split("/")[0] for name in wheel_names} == {"vaeserve", f"{dist['wheel'].name.split('-py3')[0]}.dist-info"}
    with tarfile.open(dist["sdist"]) as sdist:
        top = f"{dist['sdist'].name.removesuffix('.tar.gz')}/"
        assert missing_from(sdist.getnames(), expected, prefix=top) == []
    # The control: a wheel without a subpackage (as the package list once shipped) is caught.
    routes = "vaeserve/service/http/routes/"
    without_routes = [name for name in wheel_names if not name.startswith(routes)]
    assert missing_from(without_routes, expected) == sorted(n for n in expected if n.startswith(routes))
    entry_points = next(n for n in wheel_names if n.endswith(".dist-info/entry_points.txt"))
    assert "vaeserve = vaeserve.service.cli:main" in zipfile.ZipFile(dist["wheel"]).read(entry_points).decode()


def test_every_module_imports_from_the_installed_wheel(dist, venv, tmp_path):
    modules = module_names([n for n in zipfile.ZipFile(dist["wheel"]).namelist() if n.endswith(".py")])
    assert "vaeserve.service.http.routes.decode" in modules and "vaeserve.service.cli.serve" in modules
    script = ("import importlib, sys\n"
              "for name in sys.argv[1:]:\n"
              "    module = importlib.import_module(name)\n"
              "    assert '/site-packages/' in module.__file__, module.__file__\n"
              "print(len(sys.argv) - 1)\n")
    done = run([str(venv / "bin/python"), "-c", script, *modules], cwd=tmp_path, env=user_env(), timeout=600)
    assert done.stdout.split()[-1] == str(len(modules))
    # Installed, not linked to the checkout: no editable finder, no .pth pointing at it.
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert not [p for p in site.glob("*.pth") if str(REPO) in p.read_text()]


def test_console_script_serves_and_stops_on_sigterm(venv, tiny_model_dir, tiny_vae, tmp_path):
    port = free_port()
    cmd = [str(venv / "bin/vaeserve"), "serve", "--model", str(tiny_model_dir), "--host", "127.0.0.1",
           "--port", str(port), "--warmup", "16x2x4x4:uint8", "--max-batch", "1"]
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, cwd=tmp_path, env=user_env(), stdout=log, stderr=subprocess.STDOUT)
    running = Running(process, log_path)
    try:
        wait_ready(f"http://127.0.0.1:{port}", running, timeout=300)
        x = latents(LATENT, seed=4)
        frames = decode(f"http://127.0.0.1:{port}", x, output_type="npy")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        code = process.wait(60)
    assert code == 0, running.log()[-4000:]
    # The server decodes step by step, the reference whole: float32 rounding apart.
    assert_uint8_frames_match(frames, np.asarray(tiny_vae.decode(x, output="uint8")))


def users_project(folder: Path) -> Path:
    """A user's project whose own names are the ones our folders have in a checkout: a ``models``
    package, ``service.py`` and ``sharding.py``, each of which fails loudly when imported."""
    (folder / "models").mkdir(parents=True)
    for name in ("models/__init__.py", "service.py", "sharding.py"):
        (folder / name).write_text(f"raise SystemExit('the user\\'s own {name} was imported')\n")
    return folder


def test_a_users_own_models_service_and_sharding_shadow_nothing(venv, tiny_model_dir, tmp_path):
    project = users_project(tmp_path / "project")
    python = str(venv / "bin/python")
    script = ("import sys, numpy as np, vaeserve\n"
              "vae = vaeserve.load_vae(sys.argv[1])\n"
              "frames = vae.decode(np.zeros((1, 16, 2, 4, 4), 'f4'), output='uint8')\n"
              "print(frames.shape, vaeserve.models.__file__)\n")
    env = {**user_env(), "PYTHONPATH": str(project)}  # as a project that puts itself on the path
    out = run([python, "-c", script, str(tiny_model_dir)], cwd=project, env=env, timeout=600).stdout
    assert "(1, 5, 32, 32, 3)" in out and "/site-packages/vaeserve/models/__init__.py" in out, out
    assert "usage:" in run([python, "-m", "vaeserve", "--help"], cwd=project, env=env).stdout
    assert "usage:" in run([str(venv / "bin/vaeserve"), "serve", "--help"], cwd=project, env=env).stdout
    # The control: the project's own names are what Python finds first for the bare names.
    done = subprocess.run([python, "-c", "import models"], cwd=project, env=env, capture_output=True, text=True)
    assert "the user's own models/__init__.py was imported" in done.stderr
