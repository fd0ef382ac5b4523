"""A served model's sound decoder (``models.sound``) on the device: its weights on one device, its
programs compiled per batched latents shape and checked against the memory before they are kept,
and its decode, host latents in, host waveform out. Used by the device thread only (``DeviceRunner``).

A sound decode is small beside the video's (LTX-2's release: about 85 M parameters, a few seconds
of waveform per request), so it runs whole, on the first device of the mesh, as one program.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vaeserve import models
from vaeserve.models.loading import DEFAULT_SEED
from vaeserve.models.registry import sound_family_of
from vaeserve.models.sound import SoundInfo
from vaeserve.sharding.fits import program_total_bytes
from vaeserve.sharding.introspect import program_memory

log = logging.getLogger("vaeserve")

# The compiled check a server installs (``service.engine.startup.guard_programs``): it raises
# ``TooLargeForMemory`` for a program that cannot fit, given the batched latents it serves.
SoundCheck = Callable[[tuple[int, ...], Any], None]


def load_sound(source: str | None, *, dtype: str) -> Any:
    """The sound decoder served beside the model ``source`` names (``models.registry.sound_family_of``:
    an embedded model's, with seeded random weights; a pipeline folder's ``audio_vae/`` + ``vocoder/``),
    or None for a model without one."""
    family = sound_family_of(source)
    if family is None:
        return None
    if source is None or source in models.MODEL_NAMES:
        log.warning("using the embedded %s with RANDOM weights (seed %d): it decodes noise, not sound",
                    family.title, DEFAULT_SEED)
        return family.random_decoder(seed=DEFAULT_SEED, dtype=dtype)
    return family.load_decoder(str(source), dtype=dtype)


class SoundPrograms:
    """A sound decoder's weights on ``device`` and its compiled programs, least recently used first
    (at most ``max_entries``; None: no bound)."""

    def __init__(self, decoder: Any, device: Any, *, max_entries: int | None = None):
        self.info: SoundInfo = decoder.info
        self.parameters: int = int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(decoder.state)))
        self.weight_bytes: int = int(sum(leaf.nbytes for leaf in jax.tree.leaves(decoder.state)))
        self._apply = decoder.apply
        self._device = device
        self._state = jax.device_put(decoder.state, device)
        self._compiled: collections.OrderedDict[tuple[int, ...], Any] = collections.OrderedDict()
        self.max_entries = max_entries
        self.check: SoundCheck | None = None

    def compiled(self, shape: tuple[int, ...]) -> Any:
        """The program decoding latents ``shape`` ``(B, *layout)``, compiled (and checked) once."""
        if shape in self._compiled:
            self._compiled.move_to_end(shape)
            return self._compiled[shape]
        start = time.monotonic()
        latents = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=jax.sharding.SingleDeviceSharding(self._device))
        compiled = jax.jit(self._apply).lower(self._state, latents).compile()
        log.info("compiled the sound decode of latents %s in %.1f s", list(shape), time.monotonic() - start)
        if self.check is not None:
            self.check(shape, compiled)
        self._compiled[shape] = compiled
        while self.max_entries and len(self._compiled) > self.max_entries:
            self._compiled.popitem(last=False)
        return compiled

    def needed_bytes(self, shape: tuple[int, ...]) -> int:
        return program_total_bytes(program_memory(self.compiled(shape)))

    def decode(self, latents: np.ndarray) -> np.ndarray:
        """Latents ``(B, *layout)`` float32 → waveform ``(B, channels, samples)`` float32, on the host."""
        program = self.compiled(latents.shape)
        return np.asarray(program(self._state, jax.device_put(latents, self._device)))

    def programs(self) -> list[list]:
        """``["sound", [B, *latents], "waveform"]`` per compiled program, least recently used first."""
        return [["sound", list(shape), "waveform"] for shape in self._compiled]

    def program_memory(self) -> list[dict[str, Any]]:
        rows = []
        for shape, compiled in list(self._compiled.items()):
            memory = program_memory(compiled)
            rows.append({"program": "sound", "shape": list(shape), "variant": "waveform",
                         **{k: v for k, v in memory.items() if k != "alias_bytes"},
                         "total_bytes": program_total_bytes(memory)})
        return rows
