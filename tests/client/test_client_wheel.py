"""The client as users install it without the server: ``python -m build client`` makes the
``vaeserve-client`` wheel, which installs into a fresh virtual environment (no system site-packages)
with httpx and numpy alone — no JAX, no Flax, no vaeserve — and decodes and lists models against a
real server; ``RemoteVAE`` there says it needs torch (the ``pipelines`` extra).

Then the same environment with torch, diffusers and transformers — and nothing else of the test
environment — runs a ``WanPipeline`` with ``RemoteVAE``. Installing torch anew would cost minutes
and gigabytes, so those three and what they require (by their metadata, JAX not among them) are
linked from the test environment into a folder that a ``.pth`` file puts on the path.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.service_helpers import LATENT, REPO, latents, make_test_model, thread_server
from tests.shipping.test_wheel import run, user_env
from vaeserve import models

MODULES = {"vaeserve_client/__init__.py", "vaeserve_client/http.py", "vaeserve_client/remote_vae.py"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("client-dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO / "client")], env=user_env(), timeout=600)
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


def requirement_closure(names: list[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``names`` need, themselves included (requirements of extras left out)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        found[name] = importlib.metadata.distribution(name)
        for line in found[name].requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(found.values())


@contextlib.contextmanager
def linked_packages(venv: Path, names: list[str]) -> Iterator[list[str]]:
    """``names`` and their requirements, linked from this environment into a folder of ``venv`` that a
    ``.pth`` file adds to its path (after its own site-packages) for the duration; yields the
    distributions linked."""
    site = next((venv / "lib").glob("python3*/site-packages"))
    folder = venv / "linked"
    folder.mkdir(exist_ok=True)
    dists = requirement_closure(names)
    for dist in dists:
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            source = Path(str(dist.locate_file(top)))
            if top != "__pycache__" and source.exists() and not (folder / top).exists():
                os.symlink(source, folder / top)
    (site / "linked.pth").write_text(f"{folder}\n")
    try:
        yield [str(canonicalize_name(d.metadata["Name"])) for d in dists]
    finally:
        (site / "linked.pth").unlink()


WAN_PIPELINE_SCRIPT = """
import importlib.util, sys, numpy as np, torch, diffusers
from vaeserve_client import RemoteVAE
url, folder = sys.argv[1], sys.argv[2]
print([m for m in ("jax", "flax", "vaeserve") if importlib.util.find_spec(m)])
local = diffusers.AutoencoderKLWan.from_pretrained(folder).eval()
torch.manual_seed(10)
transformer = diffusers.WanTransformer3DModel(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
    text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", rope_max_seq_len=32).eval()
pipe = diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=local, transformer=transformer,
                             scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0))
def run(vae):
    pipe.vae = vae
    embeds = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return pipe(prompt_embeds=embeds, guidance_scale=1.0, height=32, width=32, num_frames=5, num_inference_steps=2,
                    generator=torch.Generator().manual_seed(2), output_type="np").frames
remote, expected = run(RemoteVAE(url)), run(local)
torch.manual_seed(1)
other = run(diffusers.AutoencoderKLWan(base_dim=8, num_res_blocks=1).eval())
print(float(np.abs(remote - expected).max()), float(np.abs(remote - other).max()))
"""


def test_remote_vae_runs_a_pipeline_in_a_venv_without_jax(venv, tmp_path):
    torch = pytest.importorskip("torch", reason="the pipeline needs torch")
    diffusers = pytest.importorskip("diffusers", reason="the pipeline is diffusers'")
    pytest.importorskip("transformers", reason="diffusers' pipelines need transformers to be built")
    from tests.client.test_remote_vae import FAR, FLOAT16_TOL

    torch.manual_seed(0)
    diffusers.AutoencoderKLWan(base_dim=8, num_res_blocks=1).save_pretrained(tmp_path / "wan")
    with (linked_packages(venv, ["torch", "diffusers", "transformers"]) as linked,
          thread_server(models.load_vae(str(tmp_path / "wan")), max_batch=1) as server):
        assert {"torch", "diffusers", "transformers"} <= set(linked) and not [n for n in linked if "jax" in n]
        done = run([str(venv / "bin/python"), "-c", WAN_PIPELINE_SCRIPT, server.url, str(tmp_path / "wan")],
                   cwd=tmp_path, env=user_env(), timeout=600)
    found, diffs = done.stdout.splitlines()[-2:]
    assert found == "[]"
    near, far = map(float, diffs.split())
    assert near <= FLOAT16_TOL and far > FAR
