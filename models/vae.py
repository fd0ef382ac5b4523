"""``WanVAE``: a loaded decoder, its config and metadata, and compiled decode programs."""

from __future__ import annotations

from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .config import WanVAEConfig
from .decode import OUTPUTS, Output, local_program
from .spatial import SingleDeviceContext
from .wan import WanDecoder

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
DEFAULT_CHUNK = 1


class LatentsError(ValueError):
    """Latents whose shape does not fit the model; ``expected``/``received`` say how."""

    def __init__(self, message: str, *, expected: Any, received: Any):
        super().__init__(f"{message}: expected {expected}, received {received}")
        self.expected, self.received = expected, received


def resolve_dtype(dtype: str):
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}; received {dtype!r}")
    return DTYPES[dtype]


def stream_steps(latent_frames: int, chunk: int) -> list[tuple[int, int]]:
    """``[start, stop)`` latent frames of each streaming step: frame 0 alone, then ``chunk`` at a time."""
    return [(0, 1)] + [(start, min(start + chunk, latent_frames)) for start in range(1, latent_frames, chunk)]


def check_latents_shape(shape: tuple[int, ...], config: WanVAEConfig) -> None:
    if len(shape) != 5:
        raise LatentsError("latents must be (B, C, T, H, W)", expected="5 dimensions", received=len(shape))
    if shape[1] != config.z_dim:
        raise LatentsError("latent channels", expected=config.z_dim, received=shape[1])
    if min(shape) < 1:
        raise LatentsError("every latent dimension must be ≥ 1", expected="B, T, H, W ≥ 1", received=shape)


def check_options(output: str, chunk: int) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}; received {output!r}")
    if chunk < 1:
        raise ValueError(f"chunk must be ≥ 1 latent frame; received {chunk}")


class WanVAE:
    """A Wan 2.1 VAE decoder ready to decode.

    ``decode`` takes latents ``(B, 16, T, H, W)`` (diffusers layout). Programs are compiled once per
    (shape, options) and cached by ``jax.jit``.
    """

    def __init__(self, config: WanVAEConfig, model: WanDecoder, *, dtype: str, metadata: dict[str, Any]):
        self.config = config
        self.dtype = dtype
        self.metadata = dict(metadata)
        self.graphdef, self.state = nnx.split(model)
        self.metadata.setdefault("parameters", int(sum(x.size for x in jax.tree.leaves(self.state))))
        self.metadata["dtype"] = dtype
        self._programs: dict[tuple, Any] = {}

    # -- the model as a pure function ---------------------------------------------------------
    def module(self) -> WanDecoder:
        return nnx.merge(self.graphdef, self.state)

    def _program(self, kind: str, **options):
        key = (kind, tuple(sorted(options.items())))
        if key not in self._programs:
            run = local_program(kind, self.graphdef, self.config, DTYPES[self.dtype], SingleDeviceContext, **options)
            self._programs[key] = jax.jit(run)
        return self._programs[key]

    # -- public API ----------------------------------------------------------------------------
    def decode(self, latents, *, denormalize: bool = False, output: Output = "float", chunk: int | None = None):
        """Decode ``(B, 16, T, H, W)`` latents.

        Returns float32 ``(B, 3, 1+4(T-1), 8H, 8W)`` in ``[-1, 1]`` (``output="float"``) or uint8 frames
        ``(B, 1+4(T-1), 8H, 8W, 3)`` converted on device (``output="uint8"``: a quarter of the bytes).
        ``chunk`` latent frames are decoded per scan step (default 1: the least memory).
        """
        chunk = chunk or DEFAULT_CHUNK
        check_options(output, chunk)
        check_latents_shape(tuple(np.shape(latents)), self.config)
        program = self._program("full", denormalize=denormalize, output=output, chunk=chunk)
        return program(self.state, jnp.asarray(latents, jnp.float32))

    def lower(self, shape: tuple[int, ...], *, denormalize=False, output: Output = "float", chunk: int | None = None):
        """The lowered decode program for ``shape`` (for ``memory_analysis()`` / HLO inspection)."""
        chunk = chunk or DEFAULT_CHUNK
        check_latents_shape(shape, self.config)
        program = self._program("full", denormalize=denormalize, output=output, chunk=chunk)
        return program.lower(self.state, jax.ShapeDtypeStruct(shape, jnp.float32))

    def decode_stream(self, latents, *, denormalize: bool = False, chunk: int | None = None) -> Iterator[np.ndarray]:
        """Yield uint8 frames ``(B, f, 8H, 8W, 3)`` on the host as each decode step finishes."""
        chunk = chunk or DEFAULT_CHUNK
        check_options("uint8", chunk)
        latents = np.asarray(latents, np.float32)
        check_latents_shape(latents.shape, self.config)
        step = self._program("step", denormalize=denormalize, output="uint8")
        caches = None
        for start, stop in stream_steps(latents.shape[2], chunk):
            frames, caches = step(self.state, caches, latents[:, :, start:stop])
            yield np.asarray(frames)


def init_vae(config: WanVAEConfig | None = None, *, seed: int = 0, dtype: str = "float32",
             metadata: dict[str, Any] | None = None) -> WanVAE:
    """A decoder with deterministic seeded random weights (it decodes noise: for tests and demos)."""
    config = config or WanVAEConfig()
    model = WanDecoder(config, rngs=nnx.Rngs(seed), dtype=resolve_dtype(dtype))
    meta = {"source": f"random weights (seed {seed})", "random_weights": True}
    meta.update(metadata or {})
    return WanVAE(config, model, dtype=dtype, metadata=meta)
