"""Start-up of the device worker: JAX options, the model, the mesh, the runner and the warm-up.

All of it runs in the worker thread (``Worker(startup=...)``, through ``service.engine.boot``), so
``/healthz`` answers at once and ``/readyz`` turns 200 only when a request for a warmed shape will
not stall on a compile. A multi-host slice plugs in with ``join`` (``service.slice.boot``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import models
import sharding
from models.decode import has_framewise
from models.programs import ProgramKey
from sharding.chips import platforms_without_absent_tpu
from sharding.fits import WontFitError, check_fits, device_bytes_limit

from ..limits import Limits
from ..metrics import Metrics
from ..settings import WARMUP_OUTPUTS, Settings
from .errors import StartupRefused
from .model import CompiledPrograms, ModelState, RunnerFactory, ServedShapes
from .runner import DeviceRunner

log = logging.getLogger("vaeserve")

# Joins a multi-host slice (before JAX's backends start) and returns how to attach the loaded model
# to it (``service.slice.boot.slice_joiner``).
Join = Callable[[], Callable[[ModelState], ModelState]]


def configure_jax(settings: Settings) -> None:
    choose_platforms()
    if settings.cpu_devices:
        jax.config.update("jax_num_cpu_devices", settings.cpu_devices)
    if settings.compile_cache:
        jax.config.update("jax_compilation_cache_dir", settings.compile_cache)
        # Cache every program: a decode compile is expensive even when XLA thinks it is quick.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def choose_platforms() -> None:
    """Leave an absent TPU out of JAX's platforms (``sharding.chips.platforms_without_absent_tpu``),
    unless JAX has started already (an embedding process, the tests)."""
    from jax._src import xla_bridge

    platforms = platforms_without_absent_tpu()
    if platforms is not None and not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", platforms)
        log.info("libtpu is installed but this host has no TPU chip: JAX runs on %s (JAX_PLATFORMS chooses)",
                 platforms)


def _load_vae(settings: Settings) -> Any:
    if settings.model is None:  # the embedded model's loader warns that its weights are random
        log.info("no --model given: loading the embedded default (%s)", models.loading.DEFAULT_MODEL)
    return models.load_vae(settings.model, dtype=settings.dtype,
                           embedded_weights_cache=settings.embedded_weights_cache)


def load_model(settings: Settings, *, vae: Any = None, runner_factory: RunnerFactory | None = None) -> ModelState:
    """The model (``vae`` if given, else ``settings.model``), its mesh and runner, and the request
    limits and normalization taken from its config. Nothing is compiled yet."""
    embedded = vae is None and (settings.model is None or settings.model in models.MODEL_NAMES)
    vae = vae if vae is not None else _load_vae(settings)
    if vae.config.decode_conditions:  # a decode needs a timestep and seeded noise, which requests cannot give yet
        raise StartupRefused(f"this {vae.config.class_name} decoder is timestep-conditioned or injects noise: the "
                             "service does not take a decode's timestep and seed yet; decode it with the Python API "
                             "(vae.decode(latents, timestep=..., seed=...), sharding.sharded_decode)")
    if vae.metadata.get("random_weights") and not embedded:  # an embedded model's loader said so already
        log.warning("the model has RANDOM weights: outputs are noise-like, for testing only")
    mesh = sharding.make_mesh(settings.tp, settings.dp)
    runner = (runner_factory or DeviceRunner)(vae, mesh, max_batch=settings.max_batch, dp=settings.dp)
    config = vae.config
    limits = Limits(channels=config.z_dim, max_batch=settings.max_batch, max_frames=settings.max_frames,
                    max_height=settings.max_height, max_width=settings.max_width,
                    temporal_scale=config.temporal_scale, spatial_scale=config.spatial_scale)
    device_memory = settings.device_memory_bytes or device_bytes_limit(list(mesh.devices.flat))
    framewise = has_framewise(config)
    return ModelState(
        vae=vae, runner=runner, limits=limits,
        mean=np.asarray(config.latents_mean, np.float32), std=np.asarray(config.latents_std, np.float32),
        devices=[str(d) for d in np.asarray(mesh.devices).ravel()], platform=jax.default_backend(),
        warmed=tuple(settings.warmup), served=served_shapes(settings, framewise=framewise),
        device_memory_bytes=device_memory, framewise=framewise,
        encode_served=None if settings.shapes == "any" else frozenset(settings.encode_warmup))


def served_shapes(settings: Settings, *, framewise: bool) -> ServedShapes | None:
    """What ``--shapes`` allows: None (any shape), or ``{(C, T, H, W): outputs}`` — the warm-up
    shapes with their warmed outputs, or the listed shapes with every output (``framewise`` among
    them where the model offers it)."""
    if settings.shapes == "any":
        return None
    if settings.shapes == "warmed":
        served: dict[tuple[int, ...], set[str]] = {}
        for warmup in settings.warmup:
            served.setdefault(warmup.shape, set()).update(warmup.outputs)
        return {shape: frozenset(outputs) for shape, outputs in served.items()}
    outputs = frozenset(WARMUP_OUTPUTS + (("framewise",) if framewise else ()))
    return {shape: outputs for shape in settings.shapes}


def watch_programs(vae: Any, settings: Settings, metrics: Metrics) -> None:
    """Bound the model's program cache and count what it does. The callbacks run in the thread
    that compiles (the worker's); prometheus metrics are thread-safe."""
    cache = vae.programs
    cache.max_entries = settings.max_programs or None

    def compiled(key: Any, seconds: float) -> None:
        metrics.compiles.inc()
        metrics.compile_seconds.observe(seconds)
        metrics.programs.set(len(cache))
        log.info("compiled %s in %.1f s", key.describe() if isinstance(key, ProgramKey) else key, seconds)

    def evicted(key: Any) -> None:
        metrics.evictions.inc()
        metrics.programs.set(len(cache))

    cache.on_compile, cache.on_evict = compiled, evicted
    metrics.programs.set(len(cache))


def warm_up(model: ModelState, settings: Settings) -> None:
    """Compile every program a request of each warm-up shape can need (its outputs, every batch
    bucket; the encode of each ``encode_warmup`` frame shape) before the service says it is ready."""
    cache = model.vae.programs
    evictions = cache.evictions
    if model.device_memory_bytes is None and settings.warmup:
        log.info("no per-device memory limit known (CPU devices): warm-up programs are not checked against one")
    for warmup in settings.warmup:
        start = time.monotonic()
        for output in warmup.outputs_for(images=model.vae.config.is_image):
            if output == "framewise":  # both of its outputs; its stream is its uint8 decode in pieces
                programs = [program for frames in ("uint8", "float")
                            for program in model.runner.compile(warmup.shape, output=frames, stream=False, framewise=True)]
            else:
                programs = model.runner.compile(warmup.shape, output="uint8" if output == "stream" else output,
                                                stream=output == "stream")
            check_memory(model, programs)
        log.info("warm-up %s compiled in %.1f s", warmup, time.monotonic() - start)
    if settings.encode_warmup and not model.vae.has_encoder:
        raise ValueError("--encode-warmup needs a checkpoint with an encoder; this one has none")
    for shape in settings.encode_warmup:
        start = time.monotonic()
        check_memory(model, model.runner.compile_encode(shape), what="the encode of frames")
        log.info("warm-up encode %s compiled in %.1f s", "x".join(map(str, shape)), time.monotonic() - start)
    if cache.evictions != evictions:
        raise ValueError(f"max_programs={settings.max_programs} is smaller than the {len(cache) + cache.evictions - evictions}"
                         " programs the warm-up compiled: raise it (or 0 for no limit)")


def check_memory(model: ModelState, programs: CompiledPrograms, *, what: str = "the decode of latents") -> None:
    """Refuse to start (``StartupRefused``) when a compiled program needs more bytes per device than
    ``model.device_memory_bytes`` — read from ``memory_analysis()`` before the program ever runs.
    ``what`` names the programs' inputs in the message."""
    if model.device_memory_bytes is None:
        return
    mesh = model.runner.mesh
    for shape, compiled in programs:
        try:
            needed = check_fits(compiled, shape=shape, mesh=mesh, limit=model.device_memory_bytes,
                                devices=jax.device_count(), what=what)
        except WontFitError as e:
            raise StartupRefused(str(e)) from e
        log.info("%s %s: %.3f GB per device of %.3f GB", what, shape, needed / 1e9, model.device_memory_bytes / 1e9)


def startup(settings: Settings, metrics: Metrics, *, vae: Any = None, runner_factory: RunnerFactory | None = None,
            join: Join | None = None) -> ModelState:
    """JAX options, the slice (``join``: joined before JAX starts), the model, the warm-up. On a
    multi-host slice process 0's warm-up compiles on every process (a broadcast call); followers
    compile nothing on their own."""
    configure_jax(settings)
    attach = join() if join is not None else None
    model = load_model(settings, vae=vae, runner_factory=runner_factory)
    if attach is not None:
        model = attach(model)
    watch_programs(model.vae, settings, metrics)
    if not model.follower:
        warm_up(model, settings)
    return model
