"""A served model's sound decoder (``models.sound``) on the device: its weights on one device, its
programs compiled per batched input shape and checked against the memory before they are kept,
its decode (host latents in, host waveform out) and, where it has an encoder, its encode (host
waveform in, host latents out). Used by the device thread only (``DeviceRunner``).

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
# ``TooLargeForMemory`` for a program that cannot fit, given what it is and the batched input it serves.
SoundCheck = Callable[[str, tuple[int, ...], Any], None]
# The two programs, by the job operation that runs them: what each gives (``programs``), and its name in words.
SOUND_PROGRAMS = {"sound": "waveform", "sound_encode": "latents"}
SOUND_PROGRAM_NAMES = {"sound": "the sound decode of latents", "sound_encode": "the sound encode of waveforms"}


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
    """A sound decoder's weights (and its encoder's, where ``info.encodes``) on ``device`` and its
    compiled programs, keyed by ``(operation, batched input shape)``, least recently used first (at
    most ``max_entries``; None: no bound)."""

    def __init__(self, decoder: Any, device: Any, *, max_entries: int | None = None):
        self.info: SoundInfo = decoder.info
        states = [decoder.state] + ([decoder.encoder_state] if self.info.encodes else [])
        self.parameters: int = int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(states)))
        self.weight_bytes: int = int(sum(leaf.nbytes for leaf in jax.tree.leaves(states)))
        self._device = device
        self._programs = {"sound": (decoder.apply, jax.device_put(decoder.state, device))}
        if self.info.encodes:
            self._programs["sound_encode"] = (decoder.encode, jax.device_put(decoder.encoder_state, device))
        self._compiled: collections.OrderedDict[tuple[str, tuple[int, ...]], Any] = collections.OrderedDict()
        self.max_entries = max_entries
        self.check: SoundCheck | None = None

    def compiled(self, operation: str, shape: tuple[int, ...]) -> Any:
        """The program of ``operation`` (``SOUND_PROGRAMS``) on inputs ``shape`` — latents
        ``(B, *layout)`` to decode, waveforms ``(B, channels, samples)`` to encode — compiled (and
        checked) once."""
        key = (operation, shape)
        if key in self._compiled:
            self._compiled.move_to_end(key)
            return self._compiled[key]
        function, state = self._programs[operation]
        start = time.monotonic()
        inputs = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=jax.sharding.SingleDeviceSharding(self._device))
        compiled = jax.jit(function).lower(state, inputs).compile()
        what = SOUND_PROGRAM_NAMES[operation]
        log.info("compiled %s %s in %.1f s", what, list(shape), time.monotonic() - start)
        if self.check is not None:
            self.check(what, shape, compiled)
        self._compiled[key] = compiled
        while self.max_entries and len(self._compiled) > self.max_entries:
            self._compiled.popitem(last=False)
        return compiled

    def needed_bytes(self, operation: str, shape: tuple[int, ...]) -> int:
        return program_total_bytes(program_memory(self.compiled(operation, shape)))

    def _run(self, operation: str, inputs: np.ndarray) -> np.ndarray:
        program, state = self.compiled(operation, inputs.shape), self._programs[operation][1]
        return np.asarray(program(state, jax.device_put(inputs, self._device)))

    def decode(self, latents: np.ndarray) -> np.ndarray:
        """Latents ``(B, *layout)`` float32 → waveform ``(B, channels, samples)`` float32, on the host."""
        return self._run("sound", latents)

    def encode(self, waveforms: np.ndarray) -> np.ndarray:
        """Waveforms ``(B, channels, samples)`` float32 → latents ``(B, *layout)`` float32, on the host."""
        return self._run("sound_encode", waveforms)

    def programs(self) -> list[list]:
        """``["sound", [B, *inputs], "waveform" | "latents"]`` per compiled program (a decode gives
        the waveform, an encode the latents), least recently used first."""
        return [["sound", list(shape), SOUND_PROGRAMS[operation]] for operation, shape in self._compiled]

    def program_memory(self) -> list[dict[str, Any]]:
        rows = []
        for (operation, shape), compiled in list(self._compiled.items()):
            memory = program_memory(compiled)
            rows.append({"program": "sound", "shape": list(shape), "variant": SOUND_PROGRAMS[operation],
                         **{k: v for k, v in memory.items() if k != "alias_bytes"},
                         "total_bytes": program_total_bytes(memory)})
        return rows
