"""The client as users install it without the server: ``python -m build client`` makes the
``vaeserve-client`` wheel, which installs into a fresh virtual environment (no system site-packages)
with httpx and numpy alone — no JAX, no Flax, no vaeserve — and decodes, encodes and lists models
against a real server. ``RemoteVAE`` there says it needs torch (the ``pipelines`` extra); with torch
and diffusers it is tested in ``test_remote_vae.py``.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.service_helpers import LATENT, REPO, latents, make_test_model, thread_server
from tests.shipping.test_wheel import run, user_env

MODULES = {"vaeserve_client/__init__.py", "vaeserve_client/http.py", "vaeserve_client/remote_vae.py"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("client-dist")
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(REPO / "client")], env=user_env(),
        timeout=600)
    (built,) = out.glob("vaeserve_client-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("client-venv")
    run([sys.executable, "-m", "venv", str(env_dir)], env=user_env())
    run([str(env_dir / "bin/python"), "-m", "pip", "install", "--quiet", str(wheel)], env=user_env(), timeout=600)
    return env_dir


@pytest.fixture(scope="module")
def server():
    vae = make_test_model()
    with thread_server(vae, max_batch=1) as running:
        yield running.url, vae


def test_the_wheel_holds_the_client_alone(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n for n in names if n.endswith(".py")} == MODULES
    # One top-level name of its own: it never collides with the server's ``vaeserve``.
    assert {n.split("/")[0] for n in names} == {"vaeserve_client", f"{wheel.name.split('-py3')[0]}.dist-info"}


def test_the_client_works_in_a_venv_without_jax(venv, server, tmp_path):
    url, vae = server
    x = latents(LATENT, seed=7)
    np.save(tmp_path / "z.npy", x)
    script = (
        "import importlib.util, sys, numpy as np, vaeserve_client as client\n"
        "print([m for m in ('jax', 'flax', 'vaeserve', 'torch') if importlib.util.find_spec(m)])\n"
        "print(client.__file__)\n"
        "url, folder = sys.argv[1], sys.argv[2]\n"
        "print(client.served_models(url)[0]['latents']['channels'])\n"
        "frames = client.decode(url, np.load(folder + '/z.npy'), output_type='npy')\n"
        "np.save(folder + '/frames.npy', frames)\n"
        "try:\n"
        "    client.RemoteVAE(url)\n"
        "except ImportError as error:\n"
        "    print(error)\n")
    done = run([str(venv / "bin/python"), "-c", script, url, str(tmp_path)], cwd=tmp_path, env=user_env(),
               timeout=300)
    found, location, channels, refused = done.stdout.splitlines()
    assert found == "[]"  # nothing of the server's stack (nor torch) is importable there
    assert "/site-packages/vaeserve_client/" in location and channels == "16"
    assert refused == "No module named 'torch'"
    assert_uint8_frames_match(np.load(tmp_path / "frames.npy"), np.asarray(vae.decode(x, output="uint8")))


def test_the_venv_does_not_find_the_checkout(venv, tmp_path):
    """The control for the test above: ``find_spec`` does find what is installed there (httpx), and
    the main test environment, which has JAX, is not the one the script ran in."""
    done = subprocess.run([str(venv / "bin/python"), "-c", "import httpx, jax"], cwd=tmp_path, env=user_env(),
                          capture_output=True, text=True)
    assert done.returncode != 0 and "No module named 'jax'" in done.stderr
    assert subprocess.run([sys.executable, "-c", "import jax"], capture_output=True).returncode == 0
