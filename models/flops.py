"""Nominal decoder and encoder FLOPs (multiply-add = 2), the work the reference implementation does.

Each family counts its own, layer by layer from the config, in the ``flops`` module of its folder
(``decode_flops(config, t, h, w)`` and, where counted, ``encode_flops(config, f, h, w)``, per row):
Wan per latent frame, HunyuanVideo and LTX over the whole clip, the image models as one-frame clips.
The same figure serves every implementation (ours skips the zero taps of frame 0 and never builds
the upsampled input of HunyuanVideo's upsampler; those savings are not counted as work).
Attention counts the full ``L x L`` scores the reference computes, masked or not.
"""

from __future__ import annotations

from .config import VAEConfig
from .shapes import clip_shape


def _family_flops(config: VAEConfig, what: str):
    from .registry import family_of

    module = family_of(config).part("flops")
    count = getattr(module, what, None)
    if count is None:
        raise NotImplementedError(f"{what.replace('_', ' ')} are not counted for {config.family}")
    return count


def decode_flops(config: VAEConfig, shape: tuple[int, ...]) -> float:
    """FLOPs of decoding latents ``(B, z, T, H, W)`` (an image model's ``(B, z, H, W)``)."""
    b, _, t, h, w = clip_shape(shape)
    return b * _family_flops(config, "decode_flops")(config, t, h, w)


def encode_flops(config: VAEConfig, shape: tuple[int, ...]) -> float:
    """FLOPs of encoding frames ``(B, 3, F, H, W)`` (an image model's images ``(B, 3, H, W)``: one frame)."""
    b, _, f, h, w = clip_shape(shape)
    return b * _family_flops(config, "encode_flops")(config, f, h, w)


class ClipFlops:
    """FLOP counting over a whole clip of ``frames`` frames of ``h x w``, as its sizes change."""

    def __init__(self, frames: int, h: int, w: int):
        self.frames, self.h, self.w, self.total = frames, h, w, 0.0

    @property
    def pixels(self) -> int:
        return self.frames * self.h * self.w

    def conv(self, cin: int, cout: int, taps: int = 27) -> None:
        self.total += 2.0 * taps * cin * cout * self.pixels

    def resnet(self, cin: int, cout: int) -> None:
        self.conv(cin, cout)
        self.conv(cout, cout)
        if cin != cout:
            self.conv(cin, cout, taps=1)

    def attention(self, dim: int) -> None:
        tokens = self.pixels
        self.total += 2.0 * tokens * (4 * dim * dim + 2 * tokens * dim)

    def upsample(self, temporal: bool, spatial: bool) -> None:
        self.frames = 1 + 2 * (self.frames - 1) if temporal else self.frames
        self.h, self.w = (2 * self.h, 2 * self.w) if spatial else (self.h, self.w)
