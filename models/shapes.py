"""The shape rules of the models' inputs and outputs, and the errors that name what does not fit.

Pure Python over a config (no JAX): the HTTP layer checks requests against them before anything
touches a device, and the models check them again before compiling.

Images: an image model (``config.is_image``) takes latents ``(B, C, H, W)`` and frames ``(B, 3, H, W)``
(Qwen-Image also diffusers' ``(B, C, 1, H, W)``); inside, an image is a one-frame clip
(``one_frame_clip``), so the video programs, loops and band sharding serve it unchanged, and the
time axis is dropped again at the output (``without_time``). Size limits then read as for a clip of
one frame (``clip_shape``).
"""

from __future__ import annotations

import re
from typing import Any, Literal, Protocol

# What a decode returns: float32 NCTHW frames in [-1, 1], or uint8 NTHWC frames.
Output = Literal["float", "uint8"]
OUTPUTS: tuple[Output, ...] = ("float", "uint8")

# diffusers' ``_encode`` hard-codes frame 0 alone, then 4 frames per encoder call: clips are 1 + 4k frames
# (LTX's encoders, 8x in time, take 8: ``frames_per_step``).
FRAMES_PER_CHUNK = 4


def frames_per_step(temporal_scale: int) -> int:
    """Frames an encode step takes after frame 0, and the step of valid clip lengths ``1 + k·step``:
    4 (Wan, HunyuanVideo), or the temporal scale when larger (LTX: 8)."""
    return max(FRAMES_PER_CHUNK, temporal_scale)


class ShapeRules(Protocol):
    """What the shape rules read of a model's config: the part of ``models.config.VAEConfig`` that
    sizes inputs and outputs (``z_dim``, ``frame_channels``, ``spatial_scale``, ``temporal_scale``)."""

    @property
    def is_image(self) -> bool: ...

    @property
    def takes_one_frame_clips(self) -> bool: ...

    @property
    def z_dim(self) -> int: ...

    @property
    def frame_channels(self) -> int: ...

    @property
    def spatial_scale(self) -> int: ...

    @property
    def temporal_scale(self) -> int: ...

    @property
    def min_latent_size(self) -> int:
        """The fewest latent rows and columns the decoder takes (2 where it pads by reflection: LTX-2.0)."""
        ...


def encode_frame_step(config: ShapeRules) -> int:
    """Valid clip lengths to encode are ``1 + k·step``: ``frames_per_step`` of the temporal scale,
    or a config's own ``encode_frame_step`` (MiniMax-H3's is 1: its released encode takes any
    length, the last clip padded with copies of the last frame)."""
    return getattr(config, "encode_frame_step", None) or frames_per_step(config.temporal_scale)


def min_latent_frames(config: ShapeRules) -> int:
    """The fewest latent frames a video decoder takes: 1, or a config's own ``min_latent_frames``
    (MiniMax-H3's released decode needs one whole chunk: 3)."""
    return getattr(config, "min_latent_frames", 1)


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


def parse_shape_text(text: str, count: int | tuple[int, ...], what: str) -> tuple[int, ...]:
    """``"1280x720x81"`` → ``(1280, 720, 81)``: ``count`` positive integers (or any of the counts a
    tuple lists) joined by ``x`` (or ``×``, or commas), spaces around them allowed; ``ValueError``
    naming ``what`` otherwise."""
    counts = (count,) if isinstance(count, int) else count
    parts = re.split(r"[x×,]", text.strip().lower())
    dims = tuple(int(p) for p in (part.strip() for part in parts) if p.isascii() and p.isdigit())
    if len(dims) != len(parts) or len(dims) not in counts or min(dims, default=0) < 1:
        allowed = " or ".join(map(str, counts))
        raise ValueError(f"{what} must be {allowed} positive integers joined by 'x'; received {text!r}")
    return dims


def time_axis(output: Output) -> int:
    """The time axis of decoded frames: 2 of float ``(B, 3, F, H, W)``, 1 of uint8 ``(B, F, H, W, 3)``."""
    return 2 if output == "float" else 1


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


# -- images: one-frame clips inside -----------------------------------------------------------------
TIME_AXIS = 2  # of NCTHW latents and float frames; uint8 frames (B, T, H, W, 3) have it at 1


def input_ranks(config: ShapeRules) -> tuple[int, ...]:
    """The ranks of the latents (and frames) a model takes: 5 for a video model, 4 for an image
    model, 4 or 5 (one frame) for one that ``takes_one_frame_clips``."""
    if not config.is_image:
        return (5,)
    return (4, 5) if config.takes_one_frame_clips else (4,)


def _layout_text(rank: int, time: str) -> str:
    return f"(B, C, {time}, H, W)" if rank == 5 else "(B, C, H, W)"


def is_image_shape(shape: tuple[int, ...]) -> bool:
    """An image's shape ``(B, C, H, W)`` (no time axis), as an image model takes it."""
    return len(shape) == 4


def clip_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """An image shape ``(B, C, H, W)`` as the one-frame clip it runs as, ``(B, C, 1, H, W)``; a
    clip's shape unchanged (limits and plans read it as any clip's)."""
    return (*shape[:TIME_AXIS], 1, *shape[TIME_AXIS:]) if is_image_shape(tuple(shape)) else tuple(shape)


def one_frame_clip(x: Any) -> Any:
    """Images ``(B, C, H, W)`` (NumPy or JAX) as one-frame clips ``(B, C, 1, H, W)``; clips unchanged."""
    return x[:, :, None] if x.ndim == 4 else x


def without_time(x: Any, output: str = "float") -> Any:
    """One-frame clips back to images: float ``(B, C, 1, H, W)`` → ``(B, C, H, W)``, uint8
    ``(B, 1, H, W, 3)`` → ``(B, H, W, 3)`` (``output="uint8"``)."""
    return x[:, 0] if output == "uint8" else x[:, :, 0]


def decoded_shape(config: ShapeRules, shape: tuple[int, ...], output: str = "float") -> tuple[int, ...]:
    """What a decode of latents ``shape`` returns: float ``(B, 3, F, sH, sW)`` or uint8 ``(B, F, sH,
    sW, 3)`` for a clip (``F = output_frames(T, temporal_scale)``), the same without ``F`` for an image."""
    b, _, t, h, w = clip_shape(shape)
    s = config.spatial_scale
    frames = [] if is_image_shape(tuple(shape)) else [output_frames(t, config.temporal_scale)]
    return (b, *frames, s * h, s * w, 3) if output == "uint8" else (b, 3, *frames, s * h, s * w)


# -- checks ----------------------------------------------------------------------------------------
def check_latents_shape(shape: tuple[int, ...], config: ShapeRules) -> None:
    """Latents ``(B, C, T, H, W)``; for an image model ``(B, C, H, W)`` (or, where it also takes
    one-frame clips, ``(B, C, 1, H, W)``)."""
    ranks = input_ranks(config)
    if len(shape) not in ranks:
        layouts = " or ".join(_layout_text(r, "1" if config.is_image else "T") for r in ranks)
        raise LatentsError(f"latents must be {layouts}", expected=" or ".join(f"{r} dimensions" for r in ranks),
                           received=len(shape), what="ndim")
    if shape[1] != config.z_dim:
        raise LatentsError("latent channels", expected=config.z_dim, received=shape[1], what="channels")
    if min(shape) < 1:
        raise LatentsError("every latent dimension must be ≥ 1", expected="every size ≥ 1", received=shape,
                           what="sizes")
    if config.is_image and len(shape) == 5 and shape[TIME_AXIS] != 1:
        raise LatentsError("an image model decodes one latent frame", expected=1, received=shape[TIME_AXIS],
                           what="frames")
    fewest = min_latent_frames(config)
    if len(shape) == 5 and shape[TIME_AXIS] < fewest:
        raise LatentsError(f"this decoder needs ≥ {fewest} latent frames", expected=f"T ≥ {fewest}",
                           received=shape[TIME_AXIS], what="frames")
    least = config.min_latent_size
    if min(shape[-2:]) < least:
        raise LatentsError(f"this decoder pads by reflection: latents need ≥ {least} rows and columns",
                           expected=f"H, W ≥ {least}", received=tuple(shape[-2:]), what="sizes")


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
    """Frames ``(B, 3, F, H, W)`` with ``F = 1 + 4k`` (the encoder's chunks; LTX: ``1 + 8k``) and ``H``,
    ``W`` multiples of the spatial scale (8 for Wan 2.1, HunyuanVideo and the image models, 16 for
    Wan 2.2 and HunyuanVideo 1.5, 32 for LTX); an image model's images ``(B, 3, H, W)`` (or, where it also takes
    one-frame clips, ``(B, 3, 1, H, W)``).

    diffusers silently drops frames beyond ``1 + 4k`` and crops sizes; we refuse them and name the
    nearest valid values in ``expected``.
    """
    ranks = input_ranks(config)
    if len(shape) not in ranks:
        layouts = " or ".join(_layout_text(r, "1" if config.is_image else "F") for r in ranks)
        raise FramesError(f"{'images' if config.is_image else 'frames'} must be {layouts}",
                          expected=" or ".join(f"{r} dimensions" for r in ranks), received=len(shape), what="ndim")
    if shape[1] != config.frame_channels:
        raise FramesError("frame channels", expected=config.frame_channels, received=shape[1], what="channels")
    if min(shape) < 1:
        raise FramesError("every frame dimension must be ≥ 1", expected="every size ≥ 1", received=shape,
                          what="sizes")
    shape = clip_shape(tuple(shape))
    if config.is_image and shape[TIME_AXIS] != 1:
        raise FramesError("an image model encodes one frame", expected=1, received=shape[TIME_AXIS], what="frames")
    problems = misfits(shape[4], shape[3], shape[2], spatial=config.spatial_scale,
                       temporal=encode_frame_step(config))
    if problems:
        raise problems[0]
