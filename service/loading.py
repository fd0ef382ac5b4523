"""Start-up of the device worker: JAX options, the model, the mesh, the runner and the warm-up.

All of it runs in the worker thread (``Worker(startup=...)``), so ``/healthz`` answers at once and
``/readyz`` turns 200 only when a request for a warmed shape will not stall on a compile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .codec import Limits
from .runner import DeviceRunner
from .settings import Settings, Warmup
from .state import ModelState

log = logging.getLogger("vaeserve")

# Builds the runner from (vae, mesh, max_batch=, dp=); tests pass a DeviceRunner subclass that fails.
RunnerFactory = Callable[..., DeviceRunner]


def configure_jax(settings: Settings) -> None:
    import jax

    if settings.cpu_devices:
        jax.config.update("jax_num_cpu_devices", settings.cpu_devices)
    if settings.compile_cache:
        jax.config.update("jax_compilation_cache_dir", settings.compile_cache)
        # Cache every program: a decode compile is expensive even when XLA thinks it is quick.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _load_vae(settings: Settings) -> Any:
    import models

    if settings.model is None:
        log.warning("no --model given: loading the embedded default (Wan 2.1 architecture)")
    return models.load_vae(settings.model, dtype=settings.dtype)


def load_model(settings: Settings, *, vae: Any = None, runner_factory: RunnerFactory | None = None) -> ModelState:
    """The model (``vae`` if given, else ``settings.model``), its mesh and runner, and the request
    limits and normalization taken from its config. Nothing is compiled yet."""
    import jax

    import sharding

    vae = vae if vae is not None else _load_vae(settings)
    if vae.metadata.get("random_weights"):
        log.warning("the model has RANDOM weights: outputs are noise-like, for testing only")
    mesh = sharding.make_mesh(settings.tp, settings.dp)
    runner = (runner_factory or DeviceRunner)(vae, mesh, max_batch=settings.max_batch, dp=settings.dp)
    config = vae.config
    limits = Limits(channels=config.z_dim, max_batch=settings.max_batch, max_frames=settings.max_frames,
                    max_height=settings.max_height, max_width=settings.max_width,
                    temporal_scale=config.temporal_scale, spatial_scale=config.spatial_scale)
    per_channel = (1, config.z_dim, 1, 1, 1)
    return ModelState(
        vae=vae, runner=runner, limits=limits,
        mean=np.asarray(config.latents_mean, np.float32).reshape(per_channel),
        std=np.asarray(config.latents_std, np.float32).reshape(per_channel),
        devices=[str(d) for d in np.asarray(mesh.devices).ravel()], platform=jax.default_backend(),
        warmed=tuple(settings.warmup))


def warm_up(runner: DeviceRunner, warmup: Warmup) -> None:
    """Run every program a request of this latent shape can need, for every batch bucket: zeros
    in, discarded frames out (the same calls as requests, so the same compiled programs)."""
    for size in runner.buckets:
        zeros = np.zeros((size, *warmup.shape), np.float32)
        start = time.monotonic()
        for output in warmup.outputs:
            if output == "stream":
                for _ in runner.decode_stream(zeros[:, :, :2]):  # frame 0 and one later step: every step program
                    pass
            else:
                runner.decode(zeros, output=output)
        log.info("warm-up %s x %s compiled in %.1f s", size, warmup, time.monotonic() - start)


def startup(settings: Settings, *, vae: Any = None, runner_factory: RunnerFactory | None = None) -> ModelState:
    configure_jax(settings)
    model = load_model(settings, vae=vae, runner_factory=runner_factory)
    for warmup in settings.warmup:
        warm_up(model.runner, warmup)
    return model
