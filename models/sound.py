"""A video model's sound: what a sound family is and what its decoder takes and gives. No JAX here.

Some video pipelines generate sound with the picture and decode it with models of their own beside
the video VAE (LTX-2: an audio VAE to a mel spectrogram, then a vocoder; MiniMax-H3: an audio VAE
straight to a waveform). A *sound family* is a folder under ``models/families/`` that exports a
``SoundFamily`` (``SOUND``): the pipeline folders it loads from and two loaders by lazy dotted path.
``models.registry`` lists the sound families; an embedded video model names its own
(``EmbeddedModel.sound``), and a pipeline folder is served with the first whose folders it holds.

What the service reads of a loaded sound decoder is generic: its ``SoundInfo`` (JAX-free: the sizes
and rates the HTTP layer checks and answers with), its ``state`` (a pytree of arrays) and its pure
``apply(state, latents)`` — latents ``info.latent_shape(L)`` with a batch dim first → a waveform
``(B, channels, samples)`` float32 in [-1, 1] at ``sample_rate``. A decoder whose ``info.encodes``
has an encoder too: its ``encoder_state`` and pure ``encode(encoder_state, waveform)``, a waveform
``(B, channels, samples)`` float32 at ``sample_rate`` → latents ``(B, *layout)``, their time axis
``ceil(samples / samples_per_latent_frame)`` long.

The sync rule: a clip of ``F`` frames at ``fps`` lasts ``F / fps`` seconds, so its sound has
``round(F / fps · latent_frames_per_second)`` latent frames (how ``LTX2Pipeline`` sizes them).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any

from .descriptor import FAMILIES_PACKAGE


@dataclasses.dataclass(frozen=True)
class SoundInfo:
    """A sound decoder's sizes: latents ``latent_shape(L)`` (the layout without the batch, ``None``
    in ``layout`` where the time axis is) → ``waveform_samples(L)`` samples of ``channels`` at
    ``sample_rate``. ``lost_samples``: how many fewer than ``L · samples_per_latent_frame`` a
    decode gives (LTX-2: its first latent frame makes 1 mel frame, not 4)."""

    title: str
    sample_rate: int
    channels: int
    layout: tuple[int | None, ...]  # e.g. (8, None, 16): (channels, time, mel bins)
    samples_per_latent_frame: int
    lost_samples: int = 0
    channel_axis: int = 0  # the layout's axis of latent channels (MiniMax-H3: 1, after the stereo pair)
    encodes: bool = False  # it has an encoder too: ``encoder_state`` and ``encode`` (the module docstring)

    @property
    def latent_channels(self) -> int:
        size = self.layout[self.channel_axis]
        assert size is not None, "the channel axis is not the time axis"
        return size

    @property
    def time_axis(self) -> int:
        """The time axis of unbatched latents (add one for batched)."""
        return self.layout.index(None)

    @property
    def latent_frames_per_second(self) -> float:
        return self.sample_rate / self.samples_per_latent_frame

    def latent_shape(self, frames: int) -> tuple[int, ...]:
        """Unbatched latents of ``frames`` latent frames."""
        return tuple(frames if size is None else size for size in self.layout)

    def layout_text(self) -> str:
        """``8xLx16``: the layout with ``L`` for the time axis."""
        return "x".join("L" if size is None else str(size) for size in self.layout)

    def waveform_samples(self, frames: int) -> int:
        return max(frames * self.samples_per_latent_frame - self.lost_samples, 0)

    def frames_for_video(self, video_frames: int, fps: float) -> int:
        """The sync rule: the latent frames of the sound of ``video_frames`` frames at ``fps``."""
        return round(video_frames / fps * self.latent_frames_per_second)

    def describe(self) -> dict[str, Any]:
        """What ``/v1/models`` says of the sound."""
        return {"title": self.title, "sample_rate": self.sample_rate, "channels": self.channels,
                "latent_channels": self.latent_channels, "latent_layout": self.layout_text(),
                "samples_per_latent_frame": self.samples_per_latent_frame,
                "latent_frames_per_second": self.latent_frames_per_second, "encodes": self.encodes}


@dataclasses.dataclass(frozen=True)
class SoundFamily:
    """A sound family: ``folder`` under ``models/families/``, ``title`` in words, the ``components``
    (sub-folders of a pipeline folder) its weights are read from, the diffusers ``class_names`` its
    first component's ``config.json`` may name (what tells two families' ``audio_vae/`` apart), and
    two ``"module:function"`` paths within the folder: ``load(folder, *, dtype)`` (a pipeline
    folder's decoder) and ``random(*, seed, dtype)`` (the release's architecture with seeded random
    weights). Both return a decoder with ``info``, ``state`` and ``apply`` (the module docstring)."""

    folder: str
    title: str
    components: tuple[str, ...]
    class_names: tuple[str, ...]
    load: str
    random: str

    def serves(self, pipeline: Path) -> bool:
        """``pipeline`` holds this family's components, the first of a class it names."""
        configs = [pipeline / part / "config.json" for part in self.components]
        if not all(config.is_file() for config in configs):
            return False
        try:
            class_name = json.loads(configs[0].read_text()).get("_class_name")
        except (OSError, ValueError, AttributeError):
            return False
        return class_name in self.class_names

    def resolve(self, dotted: str) -> Any:
        module, _, attribute = dotted.partition(":")
        return getattr(importlib.import_module(f"{FAMILIES_PACKAGE}.{self.folder}.{module}"), attribute)

    def load_decoder(self, folder: str, *, dtype: str = "float32") -> Any:
        return self.resolve(self.load)(folder, dtype=dtype)

    def random_decoder(self, *, seed: int, dtype: str = "float32") -> Any:
        return self.resolve(self.random)(seed=seed, dtype=dtype)
