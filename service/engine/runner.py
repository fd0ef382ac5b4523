"""The one interface to the devices: ``DeviceRunner``.

Everything that touches JAX after start-up goes through this class, from one thread (the
worker's). Its methods take host arrays and return host arrays and are deterministic, which keeps
a multi-host slice small: process 0 sends each call's inputs to every process
(``service.slice``), and every process makes the same call.

Batches are padded up to a *bucket* size (``service.engine.batches``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from vaeserve import sharding
from vaeserve.models.conditions import DecodeConditions
from vaeserve.models.encode import PosteriorOptions, posterior_options
from vaeserve.models.programs import ProgramKey
from vaeserve.models.shapes import Output, shape_text
from vaeserve.sharding.decode import Decoded, band_total, put_conditions, to_host_cropped
from vaeserve.sharding.fits import free_device_bytes, program_total_bytes
from vaeserve.sharding.introspect import program_memory
from vaeserve.sharding.mesh import mesh_key

from .batches import batch_buckets, bucket_for, pad_batch
from .errors import TooLargeForMemory
from .jobs import DecodeOptions, EncodeOptions, Operation
from .memory import available_host_bytes
from .sound import SOUND_PROGRAM_NAMES, SoundPrograms


def encode_rows(requests: Sequence[tuple[EncodeOptions, int]], batch: int) -> PosteriorOptions:
    """The posterior options of a device batch: each request's ``rows`` with its own options (so
    requests with different options share one call), padded with mean-only rows to ``batch``."""
    parts = []
    for given, rows in requests:
        options = EncodeOptions(*given)  # a list when it came from process 0 of a slice
        parts.append(posterior_options(rows, sample=options.sample, seed=options.seed, normalize=options.normalize))
    return PosteriorOptions.concatenate(parts, batch)


def decode_rows(vae: Any, requests: Sequence[tuple[DecodeOptions | None, int]], batch: int) -> DecodeConditions | None:
    """The conditions of a device batch of a decoder that takes them (None for one that does not):
    each request's ``rows`` with its own timestep, noise scale and seed (so requests with different
    ones share one call; a request's rows are what ``vae.decode`` gives it alone), padded to
    ``batch``. A request without options (None) takes the checkpoint's defaults and a fresh seed."""
    if not vae.config.decode_conditions:
        return None
    parts = [vae.conditions(rows, **({} if given is None else DecodeOptions(*given)._asdict()))
             for given, rows in requests]
    return DecodeConditions.concatenate(parts, batch) if parts else vae.conditions(batch)


class DeviceRunner:
    """Holds the model and the mesh; decodes and encodes host batches to host arrays.

    ``decode(latents (B, C, T, H, W) float32)`` returns ``Decoded``: frames ``(B, F, sH, sW, 3)``
    uint8 for ``output="uint8"`` or ``(B, 3, F, sH, sW)`` float32 in [-1, 1] for ``output="float"``
    (``s``: the model's spatial scale). Latents are expected *already denormalized* (the service
    does it on the host, so the device program does not depend on that flag). ``encode(frames
    (B, 3, F, H, W) float32, requests)`` returns float32 latents ``(B, z, T, H/s, W/s)``.
    """

    interleaves_streams = True  # each step is a call of its own: streams may take turns

    def __init__(self, vae: Any, mesh: Any, *, max_batch: int, dp: int, sound: SoundPrograms | None = None):
        self.vae = vae
        self.mesh = mesh
        self.buckets = batch_buckets(max_batch, dp)
        self.sound = sound  # the model's sound decoder, where it has one
        self._thread: int | None = None

    def _check_thread(self) -> None:
        # One thread owns the devices; a second caller would interleave collectives.
        ident = threading.get_ident()
        if self._thread is None:
            self._thread = ident
        elif self._thread != ident:
            raise RuntimeError("DeviceRunner used from two threads")

    def _padded(self, inputs: np.ndarray) -> np.ndarray:
        self._check_thread()
        return pad_batch(inputs, bucket_for(inputs.shape[0], self.buckets))

    def decode(self, latents: np.ndarray, *, output: Output = "uint8", framewise: bool = False,
               conditions: Sequence[tuple[DecodeOptions | None, int]] = ()) -> Decoded:
        n, padded = latents.shape[0], self._padded(latents)
        program = sharding.compile_decode(self.vae, padded.shape, self.mesh, output=output, framewise=framewise)
        rows = put_conditions(decode_rows(self.vae, conditions, padded.shape[0]), self.mesh)
        frames, nonfinite = program(sharding.replicated_state(self.vae, self.mesh),
                                    sharding.put_latents(padded, self.mesh), *rows)
        # all-gathered when the mesh spans processes; an uneven split's padding cropped on the host
        host = to_host_cropped(frames, padded.shape, self.vae.config.spatial_scale, output)
        return Decoded(host[:n], band_total(nonfinite)[:n])

    def decode_stream(self, latents: np.ndarray, *, output: Output = "uint8", framewise: bool = False,
                      conditions: Sequence[tuple[DecodeOptions | None, int]] = ()) -> Iterator[Decoded]:
        """Yields ``Decoded`` chunks as each decode step finishes: uint8 ``(B, f, sH, sW, 3)``, or
        float32 ``(B, 3, f, sH, sW)`` for ``output="float"``. ``conditions``: the ``(options, rows)``
        of the requests that share the batch, in order (``decode_rows``), for a decoder that takes them."""
        n, padded = latents.shape[0], self._padded(latents)
        rows = decode_rows(self.vae, conditions, padded.shape[0])
        for step in sharding.sharded_decode_stream(self.vae, padded, self.mesh, framewise=framewise, output=output,
                                                   conditions=rows):
            yield Decoded(step.frames[:n], step.nonfinite[:n])

    def decode_sound(self, latents: np.ndarray) -> np.ndarray:
        """The sound of audio latents ``(B, *layout)`` float32: waveforms ``(B, channels, samples)``
        float32 (``service.engine.sound``), the batch padded to its bucket as the video's."""
        if self.sound is None:
            raise ValueError("this model has no sound decoder")
        n, padded = latents.shape[0], self._padded(latents)
        return self.sound.decode(padded)[:n]

    def encode_sound(self, waveforms: np.ndarray) -> np.ndarray:
        """The audio latents ``(B, *layout)`` float32 of waveforms ``(B, channels, samples)`` float32
        at the sound's rate (``service.engine.sound``), the batch padded to its bucket."""
        if self.sound is None or not self.sound.info.encodes:
            raise ValueError("this model has no sound encoder")
        n, padded = waveforms.shape[0], self._padded(waveforms)
        return self.sound.encode(padded)[:n]

    def encode(self, frames: np.ndarray, requests: Sequence[tuple[EncodeOptions, int]]) -> np.ndarray:
        """Encode a batch: ``requests`` are the ``(options, rows)`` of the requests that share it,
        in order (each request's rows with its own seed and flags)."""
        n, padded = frames.shape[0], self._padded(frames)
        result = sharding.sharded_encode(self.vae, padded, self.mesh, options=encode_rows(requests, padded.shape[0]))
        return sharding.to_host(result)[:n]  # all-gathered when the mesh spans processes

    def compile_encode(self, shape: tuple[int, ...], *, sizes: Sequence[int] | None = None) -> list[tuple[tuple[int, ...], Any]]:
        """Compile, without running, the encode of frames ``shape`` ``(3, F, H, W)`` at every batch
        bucket (or those in ``sizes``; one program serves every sampling/normalization option);
        returned as ``compile`` returns them, each with the batched frames ``(B, 3, F, H, W)`` it serves."""
        self._check_thread()
        return [((size, *shape), sharding.compile_encode(self.vae, (size, *shape), self.mesh))
                for size in sizes or self.buckets]

    def compile(self, shape: tuple[int, ...], *, output: Output, stream: bool, framewise: bool = False,
                sizes: Sequence[int] | None = None) -> list[tuple[tuple[int, ...], Any]]:
        """Compile, without running, every program a request of latent ``shape`` ``(C, T, H, W)``
        can need, at every batch bucket (or those in ``sizes``): every step of its decode to
        ``output`` (``stream``: what a server runs), or the whole decode in one program
        (``framewise`` or not).
        The programs land in the model's cache (``vae.programs``), where requests find them, each
        checked against the memory it will run in first (the cache's ``check``); they are returned
        too, each with the batched latents ``(B, C, T, H, W)`` it serves, so that their
        ``memory_analysis()`` can be read before anything runs."""
        self._check_thread()
        programs: list[tuple[tuple[int, ...], Any]] = []
        for size in sizes or self.buckets:
            batched = (size, *shape)
            if stream:
                programs += [(batched, p) for p in sharding.compile_decode_stream(
                    self.vae, batched, self.mesh, framewise=framewise, output=output)]
            else:
                programs.append((batched, sharding.compile_decode(self.vae, batched, self.mesh, output=output,
                                                                  framewise=framewise)))
        return programs

    def prepare(self, operation: Operation, shape: tuple[int, ...], *, batch: int, output: Output = "uint8",
                framewise: bool = False) -> int:
        """Compile (or find) every program a device batch of ``batch`` inputs of ``shape`` runs —
        latents ``(C, T, H, W)`` decoded step by step to ``output``, or frames ``(3, F, H, W)``
        encoded — each checked against the memory it will run in (the cache's ``check`` raises
        ``TooLargeForMemory``); returns the most bytes per device any of them needs."""
        size = [bucket_for(batch, self.buckets)]
        try:
            if operation in ("sound", "sound_encode"):
                assert self.sound is not None
                return self.sound.needed_bytes(operation, (size[0], *shape))
            if operation == "encode":
                programs = self.compile_encode(shape, sizes=size)
            else:
                programs = self.compile(shape, output=output, stream=True, framewise=framewise, sizes=size)
        except TooLargeForMemory as refused:
            what = {"encode": "the encode of frames", **SOUND_PROGRAM_NAMES}.get(
                operation, "the decode of latents")
            received = shape_text((batch, *shape))
            raise TooLargeForMemory(f"{what} {received}: {refused}", needed=refused.needed,
                                    available=refused.available, received=received,
                                    would_fit=refused.would_fit) from None
        return max(program_total_bytes(program_memory(compiled)) for _, compiled in programs)

    def held_bytes(self, shape: tuple[int, ...], *, batch: int, output: Output = "uint8",
                   framewise: bool = False) -> int:
        """Bytes per device a decode of ``batch`` latents of ``shape`` ``(C, T, H, W)`` keeps between
        its steps — its caches, which its later steps take as donated arguments (0 for a decode in
        one step). Read from the programs ``prepare`` compiled (the model's cache)."""
        programs = self.compile(shape, output=output, stream=True, framewise=framewise,
                                sizes=[bucket_for(batch, self.buckets)])
        return max(program_memory(compiled)["alias_bytes"] for _, compiled in programs)

    def free_bytes(self) -> int | None:
        """Memory free per device now: the least ``bytes_limit − bytes_in_use`` over the mesh's
        devices here (TPU/GPU), or the host's ``MemAvailable`` shared by them (CPU); None where
        neither is known."""
        devices = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
        stats = [free_device_bytes(d) for d in devices]
        if stats and all(s is not None for s in stats):
            return min(s for s in stats if s is not None)
        available = available_host_bytes()
        return None if available is None else available // max(1, len(devices))

    def program_memory(self) -> list[dict[str, Any]]:
        """Per-device bytes of every compiled program of this runner's mesh (``memory_analysis()``):
        ``{"program", "shape", "variant", "argument_bytes", "output_bytes", "temp_bytes",
        "code_bytes", "total_bytes"}``, least recently used first (as ``programs()``)."""
        rows = []
        for key in self._keys():
            compiled = self.vae.programs.peek(key)
            if compiled is None:  # evicted since listed
                continue
            program, shape, variant = key.describe()
            memory = program_memory(compiled)
            rows.append({"program": program, "shape": shape, "variant": variant,
                         **{k: v for k, v in memory.items() if k != "alias_bytes"},
                         "total_bytes": program_total_bytes(memory)})
        return rows + (self.sound.program_memory() if self.sound is not None else [])

    def programs(self) -> list[list]:
        """The compiled programs of this runner's mesh in the model's cache, least recently used
        first: ``["decode", [B, C, T, H, W], output]`` (``output+framewise`` for a framewise decode), ``["stream-step", [B, C, t, H, W],
        "first" | "next"]`` or ``["encode", [B, 3, F, H, W], "latents"]``. (A read of the cache; it
        is safe from any thread.)"""
        return [key.describe() for key in self._keys()] + (self.sound.programs() if self.sound is not None else [])

    def _keys(self) -> list[ProgramKey]:
        """Cache keys of this mesh's decode, stream-step and encode programs, least recently used first."""
        mesh = mesh_key(self.mesh)
        return [key for key in self.vae.programs.keys() if isinstance(key, ProgramKey) and key.mesh == mesh]
