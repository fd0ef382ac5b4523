"""``VAE``: a loaded decoder (and encoder, when the checkpoint has one) of any family (Wan 2.1 / 2.2,
HunyuanVideo 1.0 / 1.5, LTX-Video, LTX-2, and the image VAEs: AutoencoderKL, Flux.2, Qwen-Image), its
config and metadata, and its compiled programs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .conditions import DecodeConditions
from .config import ConfigError, VAEConfig
from .conv import CPU_CONVS, ConvPath, compiler_options_for, conv_path_for
from .decode import decode_conditions, first_step_clip
from .family_modules import family_modules, family_programs
from .programs import ProgramCache
from .registry import default_config
from .shapes import NoEncoderError, Output

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def resolve_dtype(dtype: str):
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}; received {dtype!r}")
    return DTYPES[dtype]


class VAE:
    """A VAE ready to decode, and to encode when its checkpoint holds an encoder.

    ``decode`` takes latents ``(B, z, T, H, W)`` (``z = config.z_dim``: 16 for Wan 2.1 and
    HunyuanVideo, 48 for Wan 2.2, 32 for HunyuanVideo 1.5), ``encode`` frames ``(B, 3, F, H, W)``
    (diffusers layouts); an image model (``config.is_image``: SD, SDXL, Flux.1, Flux.2, Qwen-Image)
    takes latents ``(B, z, H, W)`` and images ``(B, 3, H, W)`` instead (Qwen-Image also
    ``(B, z, 1, H, W)`` and ``(B, 3, 1, H, W)``, as diffusers' class does). Every program is
    compiled ahead of time once per (shape, options, target) and kept in ``programs``, the model's
    one program cache (the sharded programs use it too). The decoder's weights are
    ``graphdef``/``state``, the encoder's ``encoder_graphdef``/``encoder_state`` (None for a
    decode-only checkpoint); the modules are the config's family's (``models.family_modules``).
    """

    def __init__(self, config: VAEConfig, model: nnx.Module, *, dtype: str, metadata: dict[str, Any],
                 encoder: nnx.Module | None = None):
        self.config = config
        self.dtype = dtype
        self.metadata = dict(metadata)
        self.graphdef, self.state = nnx.split(model)
        self.encoder_graphdef: nnx.GraphDef | None = None
        self.encoder_state: nnx.State | None = None
        if encoder is not None:
            self.encoder_graphdef, self.encoder_state = nnx.split(encoder)
        self.metadata.setdefault("parameters", int(sum(x.size for x in jax.tree.leaves(self.state))))
        self.metadata["encoder_parameters"] = int(sum(x.size for x in jax.tree.leaves(self.encoder_state)))
        self.metadata["dtype"] = dtype
        self.programs = ProgramCache()
        # A family that builds its own whole programs (MiniMax-H3), else None: the generic loops'.
        self.own_programs = family_programs(config)
        self._placed: dict[Any, Any] = {}
        self._cpu_convs = "onednn"

    @property
    def cpu_convs(self) -> str:
        """How its CPU programs run their convolutions (``models.conv.CPU_CONVS``): ``"onednn"``
        (the default: ``models.conv.onednn_conv_for``) or ``"matmul"`` (nine-tap matmuls only).
        Set it before the first compile: the programs already compiled keep the path they were
        compiled with."""
        return self._cpu_convs

    @cpu_convs.setter
    def cpu_convs(self, kind: str) -> None:
        if kind not in CPU_CONVS:
            raise ValueError(f"cpu_convs must be one of {CPU_CONVS}; received {kind!r}")
        if kind != self._cpu_convs and self.programs.compiles:
            raise ValueError(f"cpu_convs is set before the first compile ({self.programs.compiles} compiled)")
        self._cpu_convs = kind

    def conv_path(self, platform: str) -> ConvPath:
        """The conv path of its programs compiled for ``platform``'s devices."""
        return conv_path_for(platform, self.cpu_convs)

    def jit(self, run, platform: str, **options):
        """``jax.jit(run, **options)`` with the compiler options of ``platform`` (``compiler_options_for``)."""
        return jax.jit(run, compiler_options=compiler_options_for(platform, self.cpu_convs), **options)

    @property
    def has_encoder(self) -> bool:
        return self.encoder_state is not None

    @property
    def steps(self) -> bool:
        """Whether the decoder streams step by step with caches (Wan, HunyuanVideo 1.5, LTX); else
        it decodes the whole clip at once (HunyuanVideo 1.0, and a family with its own programs)."""
        return self.own_programs is None and bool(family_modules(self.config).decoder.steps_with_caches)

    def conditions(self, batch: int, *, timestep: float | None = None, noise_scale: float | None = None,
                   seed: int | None = None) -> DecodeConditions | None:
        """The host ``DecodeConditions`` of a decode of ``batch`` rows (None for a decoder that takes
        none), defaults from the checkpoint's pipeline (``metadata``): ``models.decode.decode_conditions``."""
        return decode_conditions(self.config, batch, timestep=timestep, noise_scale=noise_scale, seed=seed,
                                 defaults=self.metadata)

    def conditions_avals(self, batch: int, sharding=None) -> tuple[DecodeConditions, ...]:
        """``(DecodeConditions.avals(batch),)`` for a decoder that takes them, else ``()``: what a decode
        program's compile takes after the latents."""
        return (DecodeConditions.avals(batch, sharding),) if self.config.decode_conditions else ()

    def clip_frames_option(self, latent_frames: int) -> dict[str, Any]:
        """``{"clip_frames": n}`` for a model whose stream steps depend on the clip's length, else ``{}``:
        a program-key option, and the step program's argument. ``n`` is the clip's latent frames where
        the first step is built for them (HunyuanVideo 1.5 sizes its mid-block's keys and values by
        them), else the longest clip the first step serves (``models.decode.first_step_clip``: an LTX
        decoder takes the length at run time), with ``clip_at_run_time``."""
        decoder = family_modules(self.config).decoder
        if not decoder.needs_clip_frames:
            return {}
        runtime = {"clip_at_run_time": True} if decoder.runtime_clip_frames else {}
        return {"clip_frames": first_step_clip(self.config, latent_frames), **runtime}

    # -- the weights, placed and abstract -------------------------------------------------------
    def placed_state(self, sharding: jax.sharding.Sharding):
        """The weights laid out by ``sharding`` (e.g. replicated over a mesh), placed once and kept."""
        return self._place("decoder", sharding, self.state)

    def state_avals(self, sharding: jax.sharding.Sharding | None = None):
        """The weights as ``jax.ShapeDtypeStruct``s: enough to compile a program without placing them."""
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), self.state)

    def require_encoder(self) -> None:
        """Raise ``NoEncoderError`` unless the checkpoint had encoder weights."""
        if not self.has_encoder:
            reason = self.metadata.get("no_encoder_reason") or (
                "it has no encoder weights (encoder.*, quant_conv.*); load a full VAE checkpoint to encode")
            raise NoEncoderError(f"the model from {self.metadata.get('source', 'this checkpoint')!r} "
                                 f"can decode but not encode: {reason}")

    def placed_encoder_state(self, sharding: jax.sharding.Sharding):
        """The encoder weights laid out by ``sharding``, placed once and kept."""
        self.require_encoder()
        return self._place("encoder", sharding, self.encoder_state)

    def _place(self, half: str, sharding: jax.sharding.Sharding, state: Any):
        """``state`` (the ``half``'s weights) laid out by ``sharding``, placed once while they are the
        model's: weights assigned anew (``vae.state = ...``) are placed anew."""
        placed = self._placed.get((half, sharding))
        if placed is None or placed[0] is not state:
            placed = self._placed[half, sharding] = (state, jax.device_put(state, sharding))
        return placed[1]

    def encoder_state_avals(self, sharding: jax.sharding.Sharding | None = None):
        """The encoder weights as ``jax.ShapeDtypeStruct``s."""
        self.require_encoder()
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), self.encoder_state)

    # -- the Python API: the mesh programs on a one-device mesh ---------------------------------
    # A single device is a 1x1 mesh: every decode and encode, on one device or many, runs the one
    # program path of ``vaeserve.sharding`` (its image, whole-clip and stepped branches, program keys
    # and stream loop). That package builds on this one, so it is imported here on use.
    def compile(self, shape: tuple[int, ...], *, denormalize: bool = False, output: Output = "float",
                chunk: int | None = None, inner_frames: int | None = None,
                framewise: bool = False) -> jax.stages.Compiled:
        """The compiled decode of NCTHW latents of ``shape`` on one device
        (``sharding.compile_decode`` on ``single_device_mesh()``, cached in ``programs``):
        ``memory_analysis()`` and ``as_text()`` answer without running it. Called as
        ``compiled(vae.state, latents, *conditions)`` → frames and their ``(B, 1)`` non-finite counts."""
        from vaeserve.sharding.decode import compile_decode
        from vaeserve.sharding.mesh import single_device_mesh
        return compile_decode(self, shape, single_device_mesh(), denormalize=denormalize, output=output, chunk=chunk,
                              inner_frames=inner_frames, framewise=framewise)

    def compile_encode(self, shape: tuple[int, ...], *, chunk: int | None = None) -> jax.stages.Compiled:
        """The compiled encode of NCTHW frames of ``shape`` on one device (``sharding.compile_encode``
        on ``single_device_mesh()``, cached in ``programs``), called as ``compiled(vae.encoder_state,
        frames, posterior_options(B, ...))``; one program serves every sampling/normalization option."""
        from vaeserve.sharding.encode import compile_encode
        from vaeserve.sharding.mesh import single_device_mesh
        return compile_encode(self, shape, single_device_mesh(), chunk=chunk)

    def encode(self, frames, *, sample: bool = False, seed: int | None = None, normalize: bool = False,
               chunk: int | None = None) -> jax.Array:
        """Encode frames ``(B, 3, F, H, W)`` in [-1, 1], ``F = 1 + 4k``, ``H`` and ``W`` multiples of
        ``s = config.spatial_scale`` (8 for Wan 2.1, HunyuanVideo and the image models, 16 for Wan 2.2
        and HunyuanVideo 1.5); for an image model images ``(B, 3, H, W)``, giving ``(B, z, H/s, W/s)``.

        Returns float32 latents ``(B, z, 1 + k, H/s, W/s)`` (``z`` 16 or 48): the posterior mean (what
        pipelines use), or with ``sample`` a draw ``mean + std · noise``, row ``b``'s noise
        ``jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(seed), b), (z, 1 + k, H/s, W/s))``
        (a fresh seed when None); with ``normalize``, ``(z − latents_mean) / latents_std`` after.
        ``chunk`` groups of 4 frames are encoded per scan step (default 1: the reference's chunks).
        Raises ``NoEncoderError`` for a decode-only checkpoint, ``FramesError`` for a bad shape.
        ``sharding.sharded_encode`` on ``single_device_mesh()``.
        """
        from vaeserve.sharding.encode import sharded_encode
        from vaeserve.sharding.mesh import single_device_mesh
        return sharded_encode(self, frames, single_device_mesh(), sample=sample, seed=seed, normalize=normalize,
                              chunk=chunk)

    def decode(self, latents, *, denormalize: bool = False, output: Output = "float", chunk: int | None = None,
               inner_frames: int | None = None, framewise: bool = False, timestep: float | None = None,
               noise_scale: float | None = None, seed: int | None = None):
        """Decode ``(B, z, T, H, W)`` latents.

        Returns float32 ``(B, 3, 1+4(T-1), sH, sW)`` in ``[-1, 1]`` (``output="float"``) or uint8 frames
        ``(B, 1+4(T-1), sH, sW, 3)`` converted on device (``output="uint8"``: a quarter of the bytes);
        ``s = config.spatial_scale`` (8 for Wan 2.1 and HunyuanVideo, 16 for Wan 2.2 and HunyuanVideo 1.5).
        ``chunk`` latent frames are decoded per scan step (default 1: the least memory). Inside a step,
        the stages after each temporal upsampler run ``inner_frames`` frames at a time (None:
        automatic, one frame once a full-resolution frame holds ≥ 4 MB; ``4 · chunk``: whole steps).
        HunyuanVideo 1.0 decodes the whole clip at once (its statistics span it); ``framewise``
        decodes it as diffusers does by default instead (overlapping tiles of 16 frames, blended: an
        approximation of the model, for comparing with a pipeline's frames). An image model's latents
        ``(B, z, H, W)`` give images: float32 ``(B, 3, sH, sW)`` or uint8 ``(B, sH, sW, 3)``.

        LTX decoders from 0.9.1 on take a ``timestep`` (default: the checkpoint's pipeline's
        ``decode_timestep``, else 0.05), and some inject noise; ``noise_scale`` mixes noise into the
        latents first, as pipelines do (``decode_noise_scale``; default the pipeline's, else 0);
        ``seed`` makes the noise reproducible (``models.decode.decode_conditions``). Other decoders
        refuse them. ``sharding.sharded_decode`` on ``single_device_mesh()``.
        """
        from vaeserve.sharding.decode import sharded_decode
        from vaeserve.sharding.mesh import single_device_mesh
        return sharded_decode(self, latents, single_device_mesh(), denormalize=denormalize, output=output, chunk=chunk,
                              inner_frames=inner_frames, framewise=framewise, timestep=timestep,
                              noise_scale=noise_scale, seed=seed)

    def decode_stream(self, latents, *, denormalize: bool = False, chunk: int | None = None,
                      inner_frames: int | None = None, framewise: bool = False, timestep: float | None = None,
                      noise_scale: float | None = None, seed: int | None = None) -> Iterator[np.ndarray]:
        """Yield uint8 frames ``(B, f, sH, sW, 3)`` on the host as each decode step finishes.

        A model that is not causal in time (HunyuanVideo 1.0: its statistics span the clip) decodes
        the whole clip first (``framewise``: as diffusers does by default, see ``decode``), then
        yields it in the same pieces (frame 0, then ``temporal_scale · chunk`` frames at a time).
        Images ``(B, z, H, W)`` decode in one step, yielded as one frame ``(B, 1, sH, sW, 3)``. An
        LTX decoder's first step takes ``1 + lookahead`` latent frames; its steps then give their
        frames that far behind (``models.decode.stream_frames``); MiniMax-H3 yields a chunk at a time.
        ``timestep``, ``noise_scale``, ``seed``: as in ``decode``. ``sharding.sharded_decode_stream``
        on ``single_device_mesh()``, its frames."""
        from vaeserve.sharding.decode import sharded_decode_stream
        from vaeserve.sharding.mesh import single_device_mesh
        for decoded in sharded_decode_stream(self, latents, single_device_mesh(), denormalize=denormalize, chunk=chunk,
                                             inner_frames=inner_frames, framewise=framewise, timestep=timestep,
                                             noise_scale=noise_scale, seed=seed):
            yield decoded.frames


class _ShapeKeys:
    """Stands in for ``nnx.Rngs`` where only shapes are wanted: the layers draw their initial
    values from ``rngs.params()``, and under ``nnx.eval_shape`` one fixed key gives the same
    shapes. Drawing from a real ``nnx.Rngs`` there updates its counter through a path that builds
    an error message by walking the whole trace, at every draw: 1-5 s of a start-up for the real
    model's two halves on 2 cores, none of it needed for shapes."""

    def params(self) -> jax.Array:
        return jax.random.key(0)


def abstract_module(module_type, config: VAEConfig, dtype):
    """``module_type(config)`` with shapes and dtypes but no values (``nnx.eval_shape``)."""
    return nnx.eval_shape(lambda: module_type(config, rngs=cast(nnx.Rngs, _ShapeKeys()), dtype=dtype))


def seeded_module(module_type, config: VAEConfig, rng: np.random.Generator, dtype):
    """``module_type(config)`` with random weights drawn on the host from ``rng``: kernels
    N(0, 1/fan-in) (fan-in: every axis but the last, the output), biases N(0, 0.02²), RMS gammas and
    GroupNorm weights 1 (Flux.2's BatchNorm statistics: mean 0, variance 1), and a parameter declared
    with a ``fill`` (LTX's timestep multiplier) that value.

    Drawn with NumPy, not ``jax.random``: that compiles one small program per distinct parameter
    shape, which takes tens of seconds for the real model (both halves) on a 2-core host.
    """
    graphdef, state = nnx.split(abstract_module(module_type, config, dtype))
    leaves = []
    for path, var in nnx.to_flat_state(state):
        name, shape = str(path[-1]), var.shape
        if getattr(var, "fill", None) is not None:
            value = np.full(shape, var.fill, np.float32)
        elif name in ("gamma", "running_var") or (name == "weight" and len(shape) == 1):  # RMS gammas, GroupNorm
            value = np.ones(shape, np.float32)
        elif name == "running_mean":  # Flux.2's BatchNorm statistics: mean 0, variance 1
            value = np.zeros(shape, np.float32)
        elif name.endswith("bias"):
            value = 0.02 * rng.standard_normal(shape, np.float32)
        else:
            value = rng.standard_normal(shape, np.float32) / np.float32(np.sqrt(np.prod(shape[:-1])))
        leaves.append((path, var.replace(jnp.asarray(value.astype(dtype)))))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def init_vae(config: VAEConfig | None = None, *, seed: int = 0, dtype: str = "float32",
             metadata: dict[str, Any] | None = None, encoder: bool = True) -> VAE:
    """A VAE with deterministic seeded random weights (it decodes noise: for tests and demos);
    ``encoder=False`` leaves out the encoder, as a decode-only checkpoint does (so does a config
    whose encoder is not implemented, saying why in ``metadata["no_encoder_reason"]``)."""
    config = config or default_config()
    family = family_modules(config)
    rng = np.random.default_rng(seed)
    model = seeded_module(family.decoder, config, rng, resolve_dtype(dtype))
    meta = {"source": f"random weights (seed {seed})", "random_weights": True}
    if encoder:
        try:
            family.check_encoder(config)
        except ConfigError as e:  # a decoder this implementation runs, an encoder it does not (yet)
            encoder, meta["no_encoder_reason"] = False, str(e)
    encoder_model = seeded_module(family.encoder, config, rng, resolve_dtype(dtype)) if encoder else None
    meta.update(metadata or {})
    return VAE(config, model, dtype=dtype, metadata=meta, encoder=encoder_model)


def parameter_count(config: VAEConfig) -> int:
    """Parameters of the decoder and, where the config's encoder runs, the encoder (counted from
    shapes: nothing is initialised)."""
    family = family_modules(config)
    modules = [family.decoder]
    try:
        family.check_encoder(config)
        modules.append(family.encoder)
    except ConfigError:
        pass
    return sum(int(np.prod(leaf.shape)) for module in modules
               for leaf in jax.tree.leaves(nnx.state(abstract_module(module, config, jnp.float32))))


def abstract_vae(config: VAEConfig | None = None, *, dtype: str = "float32", encoder: bool = False) -> VAE:
    """A decoder (and with ``encoder``, its encoder) with shapes and dtypes but no weights
    (``nnx.eval_shape``): enough to compile its programs and read their memory, at no cost of
    initialising the weights. It cannot decode or encode."""
    config = config or default_config()
    family = family_modules(config)
    model = abstract_module(family.decoder, config, resolve_dtype(dtype))
    encoder_model = abstract_module(family.encoder, config, resolve_dtype(dtype)) if encoder else None
    return VAE(config, model, dtype=dtype, metadata={"source": "abstract (shapes only, no weights)",
                                                     "abstract": True}, encoder=encoder_model)

