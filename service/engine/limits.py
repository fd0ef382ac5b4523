"""The largest request the engine takes, from the settings and the model's config.

Checked by the codecs while they parse a body (before any device work), and listed by
``/v1/models``. Sizes are those of the decoded output (or of the frames to encode).
"""

from __future__ import annotations

from dataclasses import dataclass


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

    @classmethod
    def unlimited(cls, channels: int = 3) -> Limits:
        """No size limit (the offline command-line tools: the user's own machine, the user's files)."""
        huge = 2**31
        return cls(channels=channels, max_batch=huge, max_frames=huge, max_height=huge, max_width=huge)

    def output_frames(self, latent_frames: int) -> int:
        """The first latent frame gives one frame, every later one ``temporal_scale``."""
        return 1 + self.temporal_scale * (latent_frames - 1)

    @property
    def max_latent_frames(self) -> int:
        return 1 + (self.max_frames - 1) // self.temporal_scale

    @property
    def max_latent_height(self) -> int:
        return self.max_height // self.spatial_scale

    @property
    def max_latent_width(self) -> int:
        return self.max_width // self.spatial_scale
