"""Every size the memory guard suggests or advertises ("would fit: …", the largest decode and
encode) is one the model accepts, for every family: its frame step (1 + 4k frames; LTX: 1 + 8k),
its spatial scale, its image or video layout. The estimate alone: no server, no compile."""

from __future__ import annotations

import re

import pytest

from vaeserve.models.estimate import estimator
from vaeserve.models.registry import EMBEDDED
from vaeserve.models.shapes import ShapeError, check_frames_shape, check_latents_shape, clip_shape
from vaeserve.service.engine.memory import MemoryGuard, MemoryPlan
from vaeserve.service.limits import Limits

SIZE = re.compile(r"(\d+) frames? of (\d+)x(\d+)|an image of (\d+)x(\d+)")


def guard_for(config, *, fits_latents: tuple[int, ...] | None = None, fits_frames: tuple[int, ...] | None = None,
              ) -> MemoryGuard:
    """A guard whose devices hold twice what a decode of ``fits_latents`` needs (or just what an
    encode of ``fits_frames`` needs)."""
    model = estimator(config, dtype="float32", decoder_parameters=10_000_000, encoder_parameters=10_000_000)
    assert model is not None
    if fits_latents is not None:
        limit = int(2 * model.decode(fits_latents).total)
    else:
        assert fits_frames is not None
        limit = int(1.01 * model.encode(fits_frames).total)
    plan = MemoryPlan(platform="cpu", device_bytes=limit, device_source="test",
                      host_bytes=2**30, host_source="test", machine=None, reserve_bytes=0)
    t, s = config.temporal_scale, config.spatial_scale
    limits = Limits(channels=config.z_dim, max_batch=1, max_frames=1 if config.is_image else 1 + 32 * t,
                    max_height=2048, max_width=2048, temporal_scale=t, spatial_scale=s, images=config.is_image)
    return MemoryGuard(plan=plan, estimate=model, limits=limits, devices=1)


def size_of(match: re.Match) -> tuple[int, int, int]:
    """``(frames, width, height)`` of "N frames of WxH" or "an image of WxH"."""
    frames, width, height, image_width, image_height = match.groups()
    return (int(frames), int(width), int(height)) if frames else (1, int(image_width), int(image_height))


def accepted_encode(config, frames: int, width: int, height: int) -> bool:
    shape = (1, 3, height, width) if config.is_image and frames == 1 else (1, 3, frames, height, width)
    try:
        check_frames_shape(shape, config)
    except ShapeError:
        return False
    return True


def accepted_decode(config, frames: int, width: int, height: int) -> bool:
    s, t = config.spatial_scale, config.temporal_scale
    if width % s or height % s or (frames - 1) % t:
        return False
    latents = (1, config.z_dim, 1 + (frames - 1) // t, height // s, width // s)
    try:
        check_latents_shape(latents[:2] + latents[3:] if config.is_image else latents, config)
    except ShapeError:
        return False
    return True


@pytest.mark.parametrize("name", list(EMBEDDED))
def test_every_suggested_and_advertised_size_is_accepted(name):
    config = EMBEDDED[name].config()
    image = config.is_image
    small = (1, config.z_dim, 4, 4) if image else (1, config.z_dim, 2, 4, 4)
    guard = guard_for(config, fits_latents=small)
    huge_latents = (1, config.z_dim, 160, 160) if image else (1, config.z_dim, 25, 96, 160)
    t, s = config.temporal_scale, config.spatial_scale
    huge_frames = (1, 3, 160 * s, 160 * s) if image else (1, 3, 1 + 24 * max(4, t), 96 * s, 160 * s)
    decodes = [str(v) for v in guard.largest_decode()] + guard.decode_suggestions(huge_latents, "uint8")()
    encodes = [str(v) for v in guard.largest_encode()] + guard.encode_suggestions(huge_frames)()
    sizes = [(kind, size_of(m)) for kind, texts in (("decode", decodes), ("encode", encodes))
             for text in texts if (m := SIZE.fullmatch(text))]
    assert not image or all(text.startswith("an image of ") for text in decodes + encodes if SIZE.fullmatch(text))
    assert any(kind == "encode" for kind, _ in sizes) and any(kind == "decode" for kind, _ in sizes), (decodes, encodes)
    refused = [(kind, size) for kind, size in sizes
               if not (accepted_decode if kind == "decode" else accepted_encode)(config, *size)]
    assert refused == []
    assert clip_shape(huge_frames)[2] == (1 if image else 1 + 24 * max(4, t))
    if not image:  # memory for a few frames at this size: the frame count is what is suggested
        step = max(4, t)
        # memory for 3.5 steps: a step of 4 would suggest 1 + 4·7 = 29 frames, which LTX (1 + 8k) refuses
        fewer = guard_for(config, fits_frames=(1, 3, 1 + 3 * step + step // 2, 32 * s, 32 * s))
        suggested = fewer.encode_suggestions((1, 3, 1 + 12 * step, 32 * s, 32 * s))()
        frames = [size_of(m) for text in suggested if (m := SIZE.fullmatch(text))]
        assert any(size[1:] == (32 * s, 32 * s) for size in frames), suggested
        assert all(accepted_encode(config, *size) for size in frames), suggested


def test_the_check_refuses_a_length_ltx_does_not_encode():
    """The control: 13 frames (1 + 4·3) are no LTX clip (1 + 8k), 17 are."""
    config = EMBEDDED["ltx-video"].config()
    assert not accepted_encode(config, 13, 1280, 704)
    assert accepted_encode(config, 17, 1280, 704)
