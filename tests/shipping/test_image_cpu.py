"""The cpu image as an operator runs it: built by ``make image`` from the Dockerfile (on the stand-in
base), its own command, user, HEALTHCHECK and volume; served to diffusers' ``remote_decode``.

Slow (a build, several container starts): ``make test-images`` runs them, not ``make test``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers.image_helpers import REPO, Image, buildah, container, new_volume, wait_ready
from tests.helpers.service_helpers import LATENT, latents

pytestmark = pytest.mark.image

WARMUP = '["16x2x4x4:uint8"]'  # the tiny model's LATENT, uint8 programs only (one compile)


def test_runs_as_its_own_non_root_user(cpu_image: Image):
    config = cpu_image.config()
    assert config["User"] not in ("", "root", "0")
    assert config["Cmd"] == ["vaeserve", "serve"] and not config.get("Entrypoint")
    with container(cpu_image) as box:
        assert box.run("id", "-u").stdout.strip() == "10001"
        # The user may write the cache volume's folder, and nothing of the system (the control).
        volume = next(iter(config["Volumes"]))
        assert box.run("sh", "-c", f"touch {volume}/jax/probe && rm {volume}/jax/probe").returncode == 0
        assert box.run("touch", "/usr/local/bin/probe").returncode != 0


def test_remote_decode_gets_the_library_frames_health_check_and_sigterm(cpu_image, tiny_model_dir, tiny_vae,
                                                                       tmp_path):
    import torch
    from diffusers.utils.remote_utils import remote_decode

    with container(cpu_image, volumes={str(tiny_model_dir): "/models/tiny:ro"}) as box:
        assert box.healthcheck().returncode != 0  # nothing listens yet: the check can fail
        running, url = box.start_server(tmp_path / "serve.log", VAESERVE_MODEL="/models/tiny", VAESERVE_WARMUP=WARMUP,
                                        VAESERVE_MAX_BATCH="1")
        try:
            wait_ready(url, running)
            health = box.healthcheck()
            assert health.returncode == 0, health.stderr

            x = latents(LATENT, seed=3)
            frames = remote_decode(endpoint=url + "/v1/decode", tensor=torch.from_numpy(x), output_type="pt",
                                   return_type="pt", partial_postprocess=True)
        finally:
            code = running.stop()
        assert code == 0, running.log()[-4000:]
        assert "Application shutdown complete" in running.log()

    # remote_decode denormalizes (do_scaling); the library's frames of the same latents, exactly.
    ours = np.asarray(tiny_vae.decode(x, denormalize=True, output="uint8"))
    assert frames.dtype == torch.uint8 and frames.shape == ours.shape == (1, 5, 32, 32, 3)
    assert np.array_equal(frames.numpy(), ours)
    # The control: the same latents decoded without denormalizing are other frames.
    raw = np.asarray(tiny_vae.decode(x, output="uint8"))
    assert np.abs(raw.astype(int) - ours).mean() > 5


def _contents(volume: Path) -> dict[str, tuple[int, int, float]]:
    """``{relative path: (uid, size, mtime)}`` of every file in the volume, JAX's access-time
    records left out (a cache hit rewrites them)."""
    found = {}
    for path in volume.rglob("*"):
        if path.is_file() and not path.name.endswith("-atime"):
            info = path.stat()
            found[str(path.relative_to(volume))] = (info.st_uid, info.st_size, info.st_mtime)
    return found


def test_cache_volume_holds_what_a_warm_start_needs(cpu_image, tmp_path):
    """The default model (the embedded Wan 2.1) with a warm-up shape, started three times on one
    volume. Twice with ``--cpu-convs matmul``, whose programs XLA can save: the first start draws the
    model's random weights and compiles its programs, and writes both there as the image's user;
    the second reads the weights, finds every program it needs there, and writes nothing new. Then
    with the CPU default, oneDNN's convolutions, whose programs XLA cannot save: the start says so
    once (not JAX's warning per program, which reads as an out-of-memory), compiles its program
    again and writes nothing either.
    The times are printed; what they are is bench/container_startup.py's business."""
    volume = tmp_path / "volume"
    mount, uid = new_volume(cpu_image, volume)
    seconds, contents, logs = {}, {}, {}
    for start, convs in (("cold", "matmul"), ("warm", "matmul"), ("onednn", "onednn")):
        with container(cpu_image, volumes={str(volume): mount}) as box:
            running, url = box.start_server(tmp_path / f"{start}.log", VAESERVE_WARMUP='["16x1x2x2:uint8"]',
                                            VAESERVE_MAX_BATCH="1", VAESERVE_CPU_CONVS=convs, JAX_LOG_COMPILES="1")
            try:
                seconds[start] = wait_ready(url, running)
            finally:
                assert running.stop() == 0, running.log()[-4000:]
        contents[start], logs[start] = _contents(volume), running.log()
    print(f"\ncpu image, embedded wan2.1, warm-up 16x1x2x2: ready in {seconds['cold']:.1f} s cold, "
          f"{seconds['warm']:.1f} s warm (matmul), {seconds['onednn']:.1f} s warm (onednn)")

    cold = contents["cold"]
    assert [name for name in cold if name.startswith("jax/")] and all(cold[name][0] == uid for name in cold)
    weights = sorted(name for name in cold if name.startswith("embedded-weights/"))
    assert weights == [f"embedded-weights/wan2.1-random-weights-seed0/{name}"
                       for name in ("config.json", "diffusion_pytorch_model.safetensors")]
    assert "random weights kept in" in logs["cold"] and "random weights read from" in logs["warm"]
    # JAX_LOG_COMPILES: JAX logs every compile, and every one it took from the persistent cache.
    compiles, hits = ({start: log.count(text) for start, log in logs.items()}
                      for text in ("Compiling jit(", "Persistent compilation cache hit"))
    assert compiles["cold"] > 0 and hits["cold"] == 0
    assert hits["warm"] == compiles["warm"] > 0  # every program from the volume
    assert contents["warm"] == cold  # and nothing new written
    # oneDNN's: the same program compiled again, nothing written, one line that says why.
    assert compiles["onednn"] == compiles["warm"] and hits["onednn"] == 0 and contents["onednn"] == cold
    said = "--compile-cache keeps no program that runs oneDNN's convolutions"
    assert [start for start, log in logs.items() if said in log] == ["onednn"]
    assert "Error writing persistent compilation cache entry" not in logs["onednn"]


def test_build_context_is_what_the_image_needs(tmp_path):
    """What .dockerignore lets into the context: the package, its metadata and the locks; no
    .venv, tests, docs, benches or caches."""
    (tmp_path / "Containerfile").write_text("FROM scratch\nCOPY . /context\n")
    name = "localhost/vaeserve-test:context"
    buildah("bud", "--quiet", "--format", "docker", "-f", str(tmp_path / "Containerfile"), "-t", name, str(REPO))
    try:
        box = buildah("from", name)
        root = Path(buildah("mount", box)) / "context"
        top = {path.name for path in root.iterdir()}
        caches = [str(p.relative_to(root)) for p in root.rglob("*") if p.name in ("__pycache__", ".pytest_cache")]
        buildah("umount", box)
        buildah("rm", box)
    finally:
        buildah("rmi", "--force", name)
    assert top == {"pyproject.toml", "README.md", "locks", "models", "sharding", "service", "vaeserve"}
    assert caches == []
