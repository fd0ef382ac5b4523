"""The largest request the service takes, from the settings and the model's config.

Checked by the codecs while they parse a body (before any device work), and listed by
``/v1/models``. Sizes are those of the decoded output (or of the frames to encode).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vaeserve.models import shapes

from .problem import Problem


@dataclass(frozen=True)
class Limits:
    """Largest request the service accepts; sizes are of the decoded output."""

    channels: int  # latent channels of the model (16 for Wan 2.1, 48 for Wan 2.2)
    max_batch: int
    max_frames: int
    max_height: int
    max_width: int
    temporal_scale: int = 4  # the model's: frames per latent frame after the first (Wan: 4)
    spatial_scale: int = 8  # the model's: pixels per latent row/column (Wan 2.1: 8, Wan 2.2: 16)
    images: bool = False  # an image model: one frame, said as images
    # The model's frames of T latent frames where they are not 1 + s(T − 1) (MiniMax-H3's chunks:
    # ``config.num_output_frames``), and its step of valid clip lengths to encode, 1 + k·step
    # (``models.shapes.encode_frame_step``; None: ``frames_per_step`` of the temporal scale).
    decoded_frames: Callable[[int], int] | None = None
    clip_step: int | None = None
    # A model with sound (docs/audio.md): the longest sound, and how many audio latent frames it
    # may differ from its video's length.
    max_audio_seconds: float = 60.0
    audio_sync_slack: int = 1

    @classmethod
    def unlimited(cls, channels: int = 3) -> Limits:
        """No size limit (the offline command-line tools: the user's own machine, the user's files)."""
        huge = 2**31
        return cls(channels=channels, max_batch=huge, max_frames=huge, max_height=huge, max_width=huge)

    def output_frames(self, latent_frames: int) -> int:
        if self.decoded_frames is not None:
            return self.decoded_frames(latent_frames)
        return shapes.output_frames(latent_frames, self.temporal_scale)

    @property
    def encode_step(self) -> int:
        """Valid clip lengths to encode are ``1 + k·encode_step`` (4; LTX: 8; MiniMax-H3: 1):
        ``models.shapes.encode_frame_step``."""
        return self.clip_step or shapes.frames_per_step(self.temporal_scale)

    @property
    def max_latent_frames(self) -> int:
        """The most latent frames whose decode has at most ``max_frames`` frames."""
        t = shapes.latents_for_frames(self.max_frames, self.temporal_scale)
        if self.decoded_frames is None:
            return t
        while self.output_frames(t + 1) <= self.max_frames:  # fewer than s frames per latent frame
            t += 1
        while t > 1 and self.output_frames(t) > self.max_frames:
            t -= 1
        return t

    @property
    def max_latent_height(self) -> int:
        return self.max_height // self.spatial_scale

    @property
    def max_latent_width(self) -> int:
        return self.max_width // self.spatial_scale

    def check(self, *, batch: int, frames: int, height: int, width: int, what: str = "") -> None:
        """422 for the first size over its limit: ``batch``, then ``frames``, ``height``, ``width``
        (``what`` prefixes the size's name in the detail, e.g. ``"output "``)."""
        for name, value, limit, slug in (("batch", batch, self.max_batch, "too-large-batch"),
                                         ("frames", frames, self.max_frames, "too-many-frames"),
                                         ("height", height, self.max_height, "too-large-height"),
                                         ("width", width, self.max_width, "too-large-width")):
            if value > limit:
                raise Problem(422, slug, f"{what}{name} {value} is over the limit {limit}",
                              expected=f"{name} <= {limit}", received=value)
