"""Start-up of the device worker: JAX options, the models, the mesh, the runners and the warm-up.

All of it runs in the worker thread (``Worker(startup=...)``, through ``service.engine.boot``), so
``/healthz`` answers at once and ``/readyz`` turns 200 only when a request for a warmed shape will
not stall on a compile. A multi-host slice plugs in with ``join`` (``service.slice.boot``).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import numpy as np

from vaeserve import models, sharding
from vaeserve.models.conv import convs_for
from vaeserve.models.decode import has_framewise
from vaeserve.models.estimate import BYTES, Convs, estimator
from vaeserve.models.programs import ProgramKey
from vaeserve.models.shapes import encode_frame_step, shape_text
from vaeserve.sharding.chips import platforms_without_absent_tpu
from vaeserve.sharding.decode import mesh_platform
from vaeserve.sharding.fits import WontFitError, check_fits, device_bytes_limit, program_total_bytes
from vaeserve.sharding.introspect import program_memory
from vaeserve.sharding.mesh import mesh_key

from ..limits import Limits
from ..metrics import Metrics
from ..settings import WARMUP_OUTPUTS, Settings, named_model
from .errors import StartupRefused, TooLargeForMemory
from .memory import (
    MemoryGuard,
    MemoryPlan,
    beside_other_models,
    check_weights_fit,
    machine_memory,
    plan_memory,
    process_rss,
)
from .model import ModelState, RunnerFactory, ServedModels, ServedShapes
from .runner import DeviceRunner
from .sound import SoundPrograms, load_sound

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


def _load_vae(settings: Settings, source: str | None) -> Any:
    if source is None:  # the embedded model's loader warns that its weights are random
        log.info("no --model given: loading the embedded default (%s)", models.loading.DEFAULT_MODEL)
    return models.load_vae(source, dtype=settings.dtype, embedded_weights_cache=settings.embedded_weights_cache)


def check_weights_load(sources: list[str | None]) -> None:
    """Refuse to start (``StartupRefused``) when loading the models ``sources`` names (None: the
    embedded default) cannot fit the memory this process may use, all of them together: checked
    from their configs before a weight is drawn or read."""
    configs = [models.load_config(source) for source in sources]
    what = ", ".join(f"{source or models.loading.DEFAULT_MODEL!r} ({config.class_name})"
                     for source, config in zip(sources, configs, strict=True))
    check_weights_fit([models.vae.parameter_count(config) for config in configs],
                      what=f"the model{'s' if len(sources) > 1 else ''} {what}", machine=machine_memory(),
                      in_use=process_rss())


def load_vaes(settings: Settings, given: Any = None) -> tuple[dict[str, Any], dict[str, str | None]]:
    """The VAEs to serve, by name: ``given`` (a VAE, named by ``--model`` or its own name; or a dict
    of them by name), else every ``--model`` (none: the embedded default), their weights checked
    together before any is loaded. A name is ``--model``'s (``settings.named_model``). Also the
    source each was loaded from, by name (what its sound is looked up by; none for ``given``)."""
    embedded: set[str] = set()  # loaded by name: the loader said already that their weights are random
    sources: dict[str, str | None] = {}
    if isinstance(given, dict):
        vaes = dict(given)
    elif given is not None:
        vaes = {named_model(settings.model[0])[0] if settings.model else given.metadata.get("name", "vae"): given}
    else:
        named: list[tuple[str | None, str | None]] = [named_model(entry) for entry in settings.model] or [(None, None)]
        check_weights_load([source for _, source in named])
        vaes = {}
        for name, source in named:
            vae = _load_vae(settings, source)
            name = name or vae.metadata.get("name", "vae")
            vaes[name] = vae
            sources[name] = source
            if source is None or source in models.MODEL_NAMES:
                embedded.add(name)
    for name, vae in vaes.items():
        set_tiling(vae, settings)
        if vae.metadata.get("random_weights") and name not in embedded:
            log.warning("the model %s has RANDOM weights: outputs are noise-like, for testing only", name)
    return vaes, sources


def load_sounds(settings: Settings, sources: dict[str, str | None], mesh: Any) -> dict[str, SoundPrograms]:
    """The sound decoders served beside the models loaded from ``sources`` (``service.engine.sound``),
    by model name, on the mesh's first device of this process."""
    device = next(d for d in mesh.devices.flat if d.process_index == jax.process_index())
    sounds = {}
    for name, source in sources.items():
        decoder = load_sound(source, dtype=settings.dtype)
        if decoder is not None:
            sounds[name] = SoundPrograms(decoder, device, max_entries=settings.max_programs or None)
            log.info("the model %s has sound: %s (%s, %d parameters)", name, decoder.info.title, decoder.source,
                     sounds[name].parameters)
    return sounds


def set_tiling(vae: Any, settings: Settings) -> None:
    """A tiled model's tile geometry and tiles per step from the settings (``tile_size``,
    ``tile_overlap``, ``tiles_per_step``; unset: the model's own), before any program is compiled:
    its programs are built from its config and cached by the model, so a model that has compiled
    one keeps its geometry (``StartupRefused`` for another). Models without tiles have no
    ``with_tiling``."""
    with_tiling = getattr(vae.config, "with_tiling", None)
    if with_tiling is None:
        return
    try:
        config = with_tiling(size=settings.tile_size, overlap=settings.tile_overlap, per_step=settings.tiles_per_step)
    except models.ConfigError as error:
        raise StartupRefused(f"--tile-size/--tile-overlap/--tiles-per-step: {error}") from None
    if config != vae.config and vae.programs.compiles:
        raise StartupRefused("--tile-size/--tile-overlap/--tiles-per-step: the model has compiled programs of its "
                             "own tiles already; load it again to serve other tiles")
    vae.config = config


def resident_weight_bytes(vae: Any) -> int:
    """The bytes a model's weights (decoder and encoder) hold on every device that serves it."""
    meta = vae.metadata
    return (int(meta.get("parameters", 0)) + int(meta.get("encoder_parameters", 0))) * BYTES[vae.dtype]


def load_models(settings: Settings, *, vae: Any = None, runner_factory: RunnerFactory | None = None) -> ServedModels:
    """Every model served (``load_vaes``), on one mesh, each with its runner, request limits and
    normalization from its config; its programs must fit the devices' memory less the other
    models' resident weights. Nothing is compiled yet."""
    vaes, sources = load_vaes(settings, vae)
    mesh = sharding.make_mesh(settings.tp, settings.dp)
    sounds = load_sounds(settings, sources, mesh)
    platform = mesh_platform(mesh)
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    memory = plan_memory(settings, platform=platform, local_devices=len(local),
                         device_limit=device_bytes_limit(list(mesh.devices.flat)))
    weights = {name: resident_weight_bytes(loaded) + (sounds[name].weight_bytes if name in sounds else 0)
               for name, loaded in vaes.items()}
    own = {name: settings if len(vaes) == 1 else own_warmups(settings, loaded) for name, loaded in vaes.items()}
    check_warmups_taken(settings, list(own.values()))
    return ServedModels({name: model_state(own[name], name, loaded, mesh, runner_factory,
                                           beside_other_models(memory, sum(weights.values()) - weights[name]),
                                           sound=sounds.get(name))
                         for name, loaded in vaes.items()}, memory)


def own_warmups(settings: Settings, vae: Any) -> Settings:
    """The settings as one of a server's several models reads them: the ``--warmup`` entries (and
    the ``--shapes`` listed) of its latents (its channels, and a video's CxTxHxW or an image's
    CxHxW) and, where it encodes, the ``--encode-warmup`` frames of its kind (3xFxHxW or 3xHxW)."""
    config = vae.config
    dims = 3 if config.is_image else 4

    def its_own(shape: tuple[int, ...]) -> bool:
        return len(shape) == dims and shape[0] == config.z_dim

    shapes = settings.shapes if isinstance(settings.shapes, str) else [s for s in settings.shapes if its_own(s)]
    return settings.model_copy(update={
        "warmup": [w for w in settings.warmup if its_own(w.shape)], "shapes": shapes,
        "encode_warmup": [f for f in settings.encode_warmup if len(f) == dims] if vae.has_encoder else []})


def check_warmups_taken(settings: Settings, own: list[Settings]) -> None:
    """``StartupRefused`` for a warm-up entry no model served takes."""
    warmed = {w for each in own for w in each.warmup}
    encoded = {f for each in own for f in each.encode_warmup}
    left = [str(w) for w in settings.warmup if w not in warmed] + [
        f"encode {shape_text(f)}" for f in settings.encode_warmup if f not in encoded]
    if left:
        raise StartupRefused(f"no model served takes the warm-up {', '.join(left)}: a warm-up's latents have a "
                             "model's channels (and frames only for a video model)")


def load_model(settings: Settings, *, vae: Any = None, runner_factory: RunnerFactory | None = None) -> ModelState:
    """The first model ``load_models`` serves (``vae`` if given)."""
    return load_models(settings, vae=vae, runner_factory=runner_factory).first


def model_state(settings: Settings, name: str, vae: Any, mesh: Any, runner_factory: RunnerFactory | None,
                memory: MemoryPlan, *, sound: SoundPrograms | None = None) -> ModelState:
    """One model served on ``mesh``: its runner (with its ``sound`` decoder, where it has one),
    limits and normalization, its programs checked against ``memory``."""
    vae.cpu_convs = settings.cpu_convs
    with_sound = {} if sound is None else {"sound": sound}  # runner factories of tests take no sound
    runner = (runner_factory or DeviceRunner)(vae, mesh, max_batch=settings.max_batch, dp=settings.dp, **with_sound)
    config = vae.config
    limits = Limits(channels=config.z_dim, max_batch=settings.max_batch,
                    max_frames=1 if config.is_image else settings.max_frames, images=config.is_image,
                    max_height=settings.max_height, max_width=settings.max_width,
                    temporal_scale=config.temporal_scale, spatial_scale=config.spatial_scale,
                    decoded_frames=config.num_output_frames, clip_step=encode_frame_step(config),
                    max_audio_seconds=settings.max_audio_seconds, audio_sync_slack=settings.audio_sync_slack)
    framewise = has_framewise(config)
    convs = convs_for(mesh_platform(mesh), vae.cpu_convs)
    if settings.compile_cache and convs == "onednn":
        say_onednn_programs_are_not_cached()
    return ModelState(
        name=name, vae=vae, runner=runner, limits=limits,
        mean=np.asarray(config.latents_mean, np.float32), std=np.asarray(config.latents_std, np.float32),
        devices=[str(d) for d in np.asarray(mesh.devices).ravel()], platform=jax.default_backend(),
        warmed=tuple(settings.warmup), served=served_shapes(settings, framewise=framewise),
        memory=memory, guard=memory_guard(vae, memory, limits, settings, convs), framewise=framewise, convs=convs,
        encode_served=None if settings.shapes == "any" else frozenset(settings.encode_warmup),
        sound=None if sound is None else sound.info)


# What JAX warns, once per program, when XLA:CPU cannot serialize a program that calls oneDNN
# (``jax._src.compiler``): an out-of-memory it is not.
_ONEDNN_CACHE_WRITE = r"Error writing persistent compilation cache entry for .*: MemoryError: std::bad_alloc"


def say_onednn_programs_are_not_cached() -> None:
    """Say once that ``--compile-cache`` keeps no program of oneDNN's convolutions (XLA:CPU
    cannot serialize its oneDNN calls; measured with jax 0.12), and mute JAX's warning of the
    same, which it gives once per program and which reads as an out-of-memory."""
    log.warning("--compile-cache keeps no program that runs oneDNN's convolutions (--cpu-convs onednn, the CPU "
                "default): XLA cannot save them, so every start compiles them again; --cpu-convs matmul compiles "
                "programs the cache keeps, whose decodes take 1.2-1.3x as long")
    warnings.filterwarnings("ignore", message=_ONEDNN_CACHE_WRITE, category=UserWarning)


def memory_guard(vae: Any, memory: MemoryPlan, limits: Limits, settings: Settings, convs: Convs) -> MemoryGuard:
    """The checks before compiling: the model's estimate with this server's dtype, mesh and conv path."""
    def variant(dtype: str, tp: int) -> Any:
        return estimator(vae.config, dtype=dtype, decoder_parameters=int(vae.metadata.get("parameters", 0)),
                         encoder_parameters=int(vae.metadata.get("encoder_parameters", 0)), tp=tp, dp=settings.dp,
                         convs=convs)

    return MemoryGuard(plan=memory, estimate=variant(vae.dtype, settings.tp), limits=limits,
                       devices=jax.device_count(), variants=variant)


def guard_programs(model: ModelState) -> None:
    """Check every program the model compiles for this mesh — warm-up or on demand, decode step,
    whole decode or encode — against the memory it will run in, before anything can run it (the
    program cache's ``check``; a refusal is kept there, so the same program is refused at once
    next time): ``TooLargeForMemory`` naming the bytes needed, available and what would fit."""
    limit, mesh = model.device_memory_bytes, model.runner.mesh
    if limit is None:
        return
    devices, ours = jax.device_count(), mesh_key(mesh)
    what = {"decode": "the decode of latents", "stream-step": "a decode step of latents",
            "encode": "the encode of frames"}

    def check(key: Any, compiled: Any) -> None:
        if not isinstance(key, ProgramKey) or key.mesh != ours:
            return
        try:
            check_fits(compiled, shape=key.shape, mesh=mesh, limit=limit, devices=devices, what=what[key.program])
        except WontFitError as refused:
            hints = [refused.hint] + (["bfloat16 (serve with --dtype bfloat16)"] if model.vae.dtype == "float32" else [])
            raise TooLargeForMemory(str(refused), needed=refused.needed, available=limit,
                                    received=shape_text(key.shape), would_fit=hints) from None

    model.vae.programs.check = check
    sound = getattr(model.runner, "sound", None)
    if sound is not None:
        sound.check = partial(check_sound_fits, limit=limit, dtype=model.vae.dtype)


def check_sound_fits(what: str, shape: tuple[int, ...], compiled: Any, *, limit: int, dtype: str) -> None:
    """``TooLargeForMemory`` for a sound program (``what``: its decode or encode) of inputs ``shape``
    that cannot fit ``limit`` bytes (it runs whole on one device: a shorter sound, or bfloat16, is
    what would fit)."""
    needed = program_total_bytes(program_memory(compiled))
    if needed > limit:
        hints = ["a shorter sound"] + (["bfloat16 (serve with --dtype bfloat16)"] if dtype == "float32" else [])
        raise TooLargeForMemory(f"{what} {shape_text(shape)} needs {needed} bytes on its device "
                                f"and {limit} are available", needed=needed, available=limit,
                                received=shape_text(shape), would_fit=hints)


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
    """Compile every program a request of each warm-up shape can need (the steps of its outputs at
    every batch bucket; the encode of each ``encode_warmup`` frame shape), each checked against the
    memory it will run in, before the service says it is ready: a program that cannot fit refuses
    the start (``StartupRefused``)."""
    cache = model.vae.programs
    evictions = cache.evictions
    if model.device_memory_bytes is None and (settings.warmup or settings.encode_warmup):
        log.info("no per-device memory limit known: programs are not checked against one")
    for warmup in settings.warmup:
        start = time.monotonic()
        for output in warmup.outputs_for(images=model.vae.config.is_image):
            if output == "framewise":  # both of its outputs; its stream is its uint8 decode in pieces
                for frames in ("uint8", "float"):
                    refuse_start(partial(model.runner.compile, warmup.shape, output=frames, stream=True, framewise=True),
                                 warmup.shape, model)
            else:  # every decode runs as steps: uint8 and stream are the same programs
                refuse_start(partial(model.runner.compile, warmup.shape, output="float" if output == "float" else "uint8",
                                     stream=True), warmup.shape, model)
        log.info("warm-up %s compiled in %.1f s", warmup, time.monotonic() - start)
    if settings.encode_warmup and not model.vae.has_encoder:
        raise ValueError("--encode-warmup needs a checkpoint with an encoder; this one has none")
    for shape in settings.encode_warmup:
        start = time.monotonic()
        refuse_start(partial(model.runner.compile_encode, shape), shape, model, what="the encode of frames")
        log.info("warm-up encode %s compiled in %.1f s", "x".join(map(str, shape)), time.monotonic() - start)
    if cache.evictions != evictions:
        raise ValueError(f"max_programs={settings.max_programs} is smaller than the {len(cache) + cache.evictions - evictions}"
                         " programs the warm-up compiled: raise it (or 0 for no limit)")


def refuse_start(compile: Callable[[], Any], shape: tuple[int, ...], model: ModelState, *,
                 what: str = "the decode of latents") -> None:
    """``compile()`` a warm-up's programs; one that cannot fit the memory refuses the start
    (``StartupRefused``, naming the warm-up ``shape`` ``(C, T, H, W)``). Logs each one's bytes."""
    try:
        programs = compile()
    except TooLargeForMemory as refused:
        raise StartupRefused(f"{what} {shape_text(shape)}: {refused}") from None
    limit = model.device_memory_bytes
    for batched, compiled in programs:
        needed = program_total_bytes(program_memory(compiled))
        log.info("%s %s: %.3f GB per device%s", what, batched, needed / 1e9,
                 "" if limit is None else f" of {limit / 1e9:.3f} GB")


def log_memory(model: ModelState) -> None:
    """The memory plan and the largest videos this server can decode and encode (the estimate)."""
    if model.memory is not None:
        log.info(model.memory.describe())
    guard = model.guard
    if guard is None or not guard.checks:
        log.info("largest video: not estimated (no estimate for the %s family, or no memory limit): every program "
                 "is checked once compiled", model.vae.config.family)
        return
    decode = "; ".join(f"{v} ({v.bytes / 1e9:.2f} GB per device)" for v in guard.largest_decode()) or "none"
    log.info("largest decode with this memory (estimated): %s", decode)
    if model.vae.has_encoder:
        encode = "; ".join(f"{v} ({v.bytes / 1e9:.2f} GB per device)" for v in guard.largest_encode()) or "none"
        log.info("largest encode with this memory (estimated): %s", encode)


def startup(settings: Settings, metrics: Metrics, *, vae: Any = None, runner_factory: RunnerFactory | None = None,
            join: Join | None = None) -> ServedModels:
    """JAX options, the slice (``join``: joined before JAX starts), the models, the warm-up. On a
    multi-host slice (one model) process 0's warm-up compiles on every process (a broadcast call);
    followers compile nothing on their own."""
    configure_jax(settings)
    attach = join() if join is not None else None
    served = load_models(settings, vae=vae, runner_factory=runner_factory)
    if attach is not None:
        served = ServedModels({name: attach(model) for name, model in served.by_name.items()}, served.memory)
    for model in served.by_name.values():
        watch_programs(model.vae, settings, metrics)
        guard_programs(model)
    metrics.device_memory_limit.set(served.memory.device_bytes or 0)
    if not served.follower:
        several = len(served.by_name) > 1
        for model in served.by_name.values():
            log_memory(model)
            warm_up(model, own_warmups(settings, model.vae) if several else settings)
    return served
