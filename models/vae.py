"""``WanVAE``: a loaded decoder, its config and metadata, and its compiled programs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .config import WanVAEConfig
from .conv import native_conv_for
from .decode import Output, check_output, full_program, resolve_chunk, step_program, stream_steps
from .decoder import WanDecoder, check_inner_frames
from .programs import ProgramCache
from .spatial import SingleDeviceContext

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class LatentsError(ValueError):
    """Latents whose shape does not fit the model; ``expected``/``received`` say how."""

    def __init__(self, message: str, *, expected: Any, received: Any):
        super().__init__(f"{message}: expected {expected}, received {received}")
        self.expected, self.received = expected, received


def resolve_dtype(dtype: str):
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}; received {dtype!r}")
    return DTYPES[dtype]


def check_latents_shape(shape: tuple[int, ...], config: WanVAEConfig) -> None:
    if len(shape) != 5:
        raise LatentsError("latents must be (B, C, T, H, W)", expected="5 dimensions", received=len(shape))
    if shape[1] != config.z_dim:
        raise LatentsError("latent channels", expected=config.z_dim, received=shape[1])
    if min(shape) < 1:
        raise LatentsError("every latent dimension must be ≥ 1", expected="B, T, H, W ≥ 1", received=shape)


class WanVAE:
    """A Wan 2.1 or 2.2 VAE decoder ready to decode.

    ``decode`` takes latents ``(B, z, T, H, W)`` (diffusers layout; ``z = config.z_dim``: 16 for
    Wan 2.1, 48 for Wan 2.2). Every program is compiled
    ahead of time once per (shape, options, target) and kept in ``programs``, the model's one
    program cache (the sharded decode uses it too).
    """

    def __init__(self, config: WanVAEConfig, model: WanDecoder, *, dtype: str, metadata: dict[str, Any]):
        self.config = config
        self.dtype = dtype
        self.metadata = dict(metadata)
        self.graphdef, self.state = nnx.split(model)
        self.metadata.setdefault("parameters", int(sum(x.size for x in jax.tree.leaves(self.state))))
        self.metadata["dtype"] = dtype
        self.programs = ProgramCache()
        self._placed: dict[Any, Any] = {}

    # -- the weights, placed and abstract -------------------------------------------------------
    def placed_state(self, sharding: jax.sharding.Sharding):
        """The weights laid out by ``sharding`` (e.g. replicated over a mesh), placed once and kept."""
        if sharding not in self._placed:
            self._placed[sharding] = jax.device_put(self.state, sharding)
        return self._placed[sharding]

    def state_avals(self, sharding: jax.sharding.Sharding | None = None):
        """The weights as ``jax.ShapeDtypeStruct``s: enough to compile a program without placing them."""
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), self.state)

    # -- single-device programs -----------------------------------------------------------------
    def _context(self) -> SingleDeviceContext:
        return SingleDeviceContext(native_conv=native_conv_for(jax.devices()[0].platform))

    def compile(self, shape: tuple[int, ...], *, denormalize: bool = False, output: Output = "float",
                chunk: int | None = None, inner_frames: int | None = None) -> jax.stages.Compiled:
        """The compiled single-device decode of NCTHW latents of ``shape`` (cached in ``programs``;
        ``memory_analysis()`` and ``as_text()`` answer without running it)."""
        shape, output, chunk = tuple(shape), check_output(output), resolve_chunk(chunk)
        inner_frames = check_inner_frames(inner_frames)
        check_latents_shape(shape, self.config)
        key = ("decode", None, shape, output, denormalize, chunk, inner_frames)

        def lower():
            run = full_program(self.graphdef, self.config, DTYPES[self.dtype], self._context,
                               denormalize=denormalize, output=output, chunk=chunk, inner_frames=inner_frames)
            return jax.jit(run).lower(self.state_avals(), jax.ShapeDtypeStruct(shape, jnp.float32))

        return self.programs.get(key, lower)

    def _compile_step(self, shape: tuple[int, ...], caches, *, denormalize: bool,
                      inner_frames: int | None) -> jax.stages.Compiled:
        """The stream step for latents of ``shape`` after ``caches`` (abstract; None for frame 0)."""
        key = ("decode-step", None, tuple(shape), caches is None, denormalize, inner_frames)

        def lower():
            run = step_program(self.graphdef, self.config, DTYPES[self.dtype], self._context,
                               denormalize=denormalize, output="uint8", inner_frames=inner_frames)
            return jax.jit(run).lower(self.state_avals(), caches, jax.ShapeDtypeStruct(shape, jnp.float32))

        return self.programs.get(key, lower)

    # -- public API ----------------------------------------------------------------------------
    def decode(self, latents, *, denormalize: bool = False, output: Output = "float", chunk: int | None = None,
               inner_frames: int | None = None):
        """Decode ``(B, z, T, H, W)`` latents.

        Returns float32 ``(B, 3, 1+4(T-1), sH, sW)`` in ``[-1, 1]`` (``output="float"``) or uint8 frames
        ``(B, 1+4(T-1), sH, sW, 3)`` converted on device (``output="uint8"``: a quarter of the bytes);
        ``s = config.spatial_scale`` (8 for Wan 2.1, 16 for Wan 2.2).
        ``chunk`` latent frames are decoded per scan step (default 1: the least memory). Inside a step,
        the stages after each temporal upsampler run ``inner_frames`` frames at a time (None:
        automatic, one frame once a full-resolution frame holds ≥ 4 MB; ``4 · chunk``: whole steps).
        """
        program = self.compile(np.shape(latents), denormalize=denormalize, output=output, chunk=chunk,
                               inner_frames=inner_frames)
        return program(self.state, jnp.asarray(latents, jnp.float32))

    def decode_stream(self, latents, *, denormalize: bool = False, chunk: int | None = None,
                      inner_frames: int | None = None) -> Iterator[np.ndarray]:
        """Yield uint8 frames ``(B, f, sH, sW, 3)`` on the host as each decode step finishes."""
        chunk, inner_frames = resolve_chunk(chunk), check_inner_frames(inner_frames)
        latents = np.asarray(latents, np.float32)
        check_latents_shape(latents.shape, self.config)
        caches = None
        for start, stop in stream_steps(latents.shape[2], chunk):
            z = latents[:, :, start:stop]
            step = self._compile_step(z.shape, None if caches is None else _avals(caches), denormalize=denormalize,
                                      inner_frames=inner_frames)
            frames, caches = step(self.state, caches, z)
            yield np.asarray(frames)


def _avals(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def init_vae(config: WanVAEConfig | None = None, *, seed: int = 0, dtype: str = "float32",
             metadata: dict[str, Any] | None = None) -> WanVAE:
    """A decoder with deterministic seeded random weights (it decodes noise: for tests and demos)."""
    config = config or WanVAEConfig()
    model = WanDecoder(config, rngs=nnx.Rngs(seed), dtype=resolve_dtype(dtype))
    meta = {"source": f"random weights (seed {seed})", "random_weights": True}
    meta.update(metadata or {})
    return WanVAE(config, model, dtype=dtype, metadata=meta)


def abstract_vae(config: WanVAEConfig | None = None, *, dtype: str = "float32") -> WanVAE:
    """A decoder with shapes and dtypes but no weights (``nnx.eval_shape``): enough to compile
    its programs and read their memory, at no cost of initialising the weights. It cannot decode."""
    config = config or WanVAEConfig()
    model = nnx.eval_shape(lambda: WanDecoder(config, rngs=nnx.Rngs(0), dtype=resolve_dtype(dtype)))
    return WanVAE(config, model, dtype=dtype, metadata={"source": "abstract (shapes only, no weights)",
                                                        "abstract": True})
