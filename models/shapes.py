"""The shape rules of the models' inputs, and the errors that name what does not fit.

Pure Python over a config (no JAX): the HTTP layer checks requests against them before anything
touches a device, and the models check them again before compiling.
"""

from __future__ import annotations

from typing import Any, Literal

from .config import VAEConfig

# What a decode returns: float32 NCTHW frames in [-1, 1], or uint8 NTHWC frames.
Output = Literal["float", "uint8"]
OUTPUTS: tuple[Output, ...] = ("float", "uint8")

# diffusers' ``_encode`` hard-codes frame 0 alone, then 4 frames per encoder call: clips are 1 + 4k frames.
FRAMES_PER_CHUNK = 4


def check_output(output: str) -> Output:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}; received {output!r}")
    return output


class ShapeError(ValueError):
    """An input whose shape does not fit the model; ``expected``/``received`` say how, ``what``
    names the part that does not fit (``"ndim"``, ``"channels"``, ``"sizes"``, ``"frames"``,
    ``"height"``, ``"width"``)."""

    def __init__(self, message: str, *, expected: Any, received: Any, what: str = "shape"):
        super().__init__(f"{message}: expected {expected}, received {received}")
        self.expected, self.received, self.what = expected, received, what


class LatentsError(ShapeError):
    """Latents whose shape does not fit the decoder."""


class FramesError(ShapeError):
    """Frames whose shape does not fit the encoder."""


class NoEncoderError(RuntimeError):
    """Encode asked of a model whose checkpoint holds no encoder weights."""


def check_latents_shape(shape: tuple[int, ...], config: VAEConfig) -> None:
    if len(shape) != 5:
        raise LatentsError("latents must be (B, C, T, H, W)", expected="5 dimensions", received=len(shape))
    if shape[1] != config.z_dim:
        raise LatentsError("latent channels", expected=config.z_dim, received=shape[1])
    if min(shape) < 1:
        raise LatentsError("every latent dimension must be ≥ 1", expected="B, T, H, W ≥ 1", received=shape)


def nearest_valid(value: int, step: int, offset: int = 0) -> list[int]:
    """The valid values ``offset + step·k`` just below and above ``value`` (positive, and for
    ``offset`` 0 at least ``step``): ``nearest_valid(7, 4, 1) == [5, 9]``, ``nearest_valid(5, 8) == [8]``."""
    lower = offset + (value - offset) // step * step
    return [v for v in (lower, lower + step) if v >= (offset or step)]


def check_frames_shape(shape: tuple[int, ...], config: VAEConfig) -> None:
    """Frames ``(B, 3, F, H, W)`` with ``F = 1 + 4k`` and ``H``, ``W`` multiples of the spatial scale
    (8 for Wan 2.1 and HunyuanVideo, 16 for Wan 2.2 and HunyuanVideo 1.5).

    diffusers silently drops frames beyond ``1 + 4k`` and crops sizes; we refuse them and name the
    nearest valid values in ``expected``.
    """
    if len(shape) != 5:
        raise FramesError("frames must be (B, C, F, H, W)", expected="5 dimensions", received=len(shape), what="ndim")
    if shape[1] != config.frame_channels:
        raise FramesError("frame channels", expected=config.frame_channels, received=shape[1], what="channels")
    if min(shape) < 1:
        raise FramesError("every frame dimension must be ≥ 1", expected="B, F, H, W ≥ 1", received=shape,
                          what="sizes")
    if (shape[2] - 1) % FRAMES_PER_CHUNK:
        raise FramesError(f"the frame count must be 1 + {FRAMES_PER_CHUNK}k",
                          expected=nearest_valid(shape[2], FRAMES_PER_CHUNK, 1), received=shape[2], what="frames")
    scale = config.spatial_scale
    for axis, name in ((3, "height"), (4, "width")):
        if shape[axis] % scale:
            raise FramesError(f"the {name} must be a multiple of {scale}",
                              expected=nearest_valid(shape[axis], scale), received=shape[axis], what=name)
