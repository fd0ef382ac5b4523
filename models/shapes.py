"""The shape rules of the models' inputs, and the errors that name what does not fit.

Pure Python over a config (no JAX): the HTTP layer checks requests against them before anything
touches a device, and the models check them again before compiling.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Protocol

# What a decode returns: float32 NCTHW frames in [-1, 1], or uint8 NTHWC frames.
Output = Literal["float", "uint8"]
OUTPUTS: tuple[Output, ...] = ("float", "uint8")

# diffusers' ``_encode`` hard-codes frame 0 alone, then 4 frames per encoder call: clips are 1 + 4k frames.
FRAMES_PER_CHUNK = 4


class ShapeRules(Protocol):
    """What the shape rules read of a model's config: the part of ``models.config.VAEConfig`` that
    sizes inputs and outputs (``z_dim``, ``frame_channels``, ``spatial_scale``, ``temporal_scale``)."""

    @property
    def z_dim(self) -> int: ...

    @property
    def frame_channels(self) -> int: ...

    @property
    def spatial_scale(self) -> int: ...

    @property
    def temporal_scale(self) -> int: ...


def output_frames(latent_frames: int, temporal_scale: int) -> int:
    """Frames decoded from ``latent_frames``: the first latent frame gives one frame, every later
    one ``temporal_scale`` (``1 + s(T − 1)``)."""
    return 1 + temporal_scale * (latent_frames - 1)


def latents_for_frames(frames: int, temporal_scale: int) -> int:
    """The most latent frames whose decode has at most ``frames`` frames (the inverse of
    :func:`output_frames` on ``1 + s·k``)."""
    return 1 + (frames - 1) // temporal_scale


def shape_text(shape: tuple[int, ...] | list[int]) -> str:
    """``(16, 2, 4, 4)`` → ``"16x2x4x4"``, as shapes appear in messages, settings and flags."""
    return "x".join(map(str, shape))


def parse_shape_text(text: str, count: int, what: str) -> tuple[int, ...]:
    """``"1280x720x81"`` → ``(1280, 720, 81)``: ``count`` positive integers joined by ``x`` (or
    ``×``, or commas), spaces around them allowed; ``ValueError`` naming ``what`` otherwise."""
    parts = re.split(r"[x×,]", text.strip().lower())
    dims = tuple(int(p) for p in (part.strip() for part in parts) if p.isascii() and p.isdigit())
    if len(dims) != len(parts) or len(dims) != count or min(dims, default=0) < 1:
        raise ValueError(f"{what} must be {count} positive integers joined by 'x'; received {text!r}")
    return dims


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


def check_latents_shape(shape: tuple[int, ...], config: ShapeRules) -> None:
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


def misfits(width: int, height: int, frames: int, *, spatial: int, temporal: int) -> list[FramesError]:
    """Every way a video of ``width`` x ``height`` x ``frames`` breaks the rule ``frames = 1 +
    temporal·k``, sizes multiples of ``spatial``: one error each, naming the nearest valid values."""
    problems = []
    if (frames - 1) % temporal:
        problems.append(FramesError(f"the frame count must be 1 + {temporal}k", expected=nearest_valid(frames, temporal, 1),
                                    received=frames, what="frames"))
    for name, size in (("height", height), ("width", width)):
        if size % spatial:
            problems.append(FramesError(f"the {name} must be a multiple of {spatial}",
                                        expected=nearest_valid(size, spatial), received=size, what=name))
    return problems


def check_frames_shape(shape: tuple[int, ...], config: ShapeRules) -> None:
    """Frames ``(B, 3, F, H, W)`` with ``F = 1 + 4k`` (the encoder's chunks) and ``H``, ``W``
    multiples of the spatial scale (8 for Wan 2.1 and HunyuanVideo, 16 for Wan 2.2 and HunyuanVideo 1.5).

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
    problems = misfits(shape[4], shape[3], shape[2], spatial=config.spatial_scale, temporal=FRAMES_PER_CHUNK)
    if problems:
        raise problems[0]
