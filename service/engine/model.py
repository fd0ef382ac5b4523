"""What start-up produced: each model served, its runner and limits, what is served. Read-only afterwards.

Also the two seams a multi-host slice plugs into (``service.slice``): the ``Runner`` the worker
calls (process 0's runner sends every call to every process first) and the ``Cluster`` hook (a
follower's device loop, a follower's stop request, leaving the slice after the drain).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from vaeserve.models.estimate import Convs
from vaeserve.models.shapes import Output, shape_text
from vaeserve.models.sound import SoundInfo

from ..limits import Limits
from .errors import ModelNotNamed, ModelNotServed, NoEncoder, ShapeNotServed
from .jobs import DecodeOptions, EncodeOptions, Operation
from .memory import MemoryGuard, MemoryPlan

# Strict shapes: latent (C, T, H, W) -> the outputs served for it ("uint8", "float", "stream", "framewise").
ServedShapes = dict[tuple[int, ...], frozenset[str]]
CompiledPrograms = list[tuple[tuple[int, ...], Any]]  # (batched input shape, compiled program)


class Runner(Protocol):
    """The device calls the worker and the warm-up make (``DeviceRunner``; on a multi-host slice,
    process 0's ``SliceRunner``, which makes each on every process). Host arrays in and out."""

    vae: Any
    mesh: Any
    buckets: list[int]
    # Whether the steps of two decode streams may take turns on the device (a stream set aside
    # while its reader catches up): True on one host; False on a multi-host slice, whose other
    # processes run each call to its end before they take the next.
    interleaves_streams: bool

    # ``conditions``: each request's ``(DecodeOptions, rows)`` in the batch (``runner.decode_rows``).
    def decode(self, latents: np.ndarray, *, output: Output = "uint8", framewise: bool = False,
               conditions: Sequence[tuple[DecodeOptions | None, int]] = ()) -> Any: ...  # Decoded(frames, nonfinite)

    def decode_stream(self, latents: np.ndarray, *, output: Output = "uint8", framewise: bool = False,
                      conditions: Sequence[tuple[DecodeOptions | None, int]] = ()) -> Iterator[Any]: ...  # Decoded per step

    def encode(self, frames: np.ndarray, requests: Sequence[tuple[EncodeOptions, int]]) -> np.ndarray: ...

    def decode_sound(self, latents: np.ndarray) -> np.ndarray: ...  # audio latents -> waveforms (B, channels, samples)

    def encode_sound(self, waveforms: np.ndarray) -> np.ndarray: ...  # waveforms (B, channels, samples) -> audio latents

    def compile(self, shape: tuple[int, ...], *, output: Output, stream: bool, framewise: bool = False,
                sizes: Sequence[int] | None = None) -> CompiledPrograms: ...

    def compile_encode(self, shape: tuple[int, ...], *, sizes: Sequence[int] | None = None) -> CompiledPrograms: ...

    # Compiles (or finds) and checks a device batch's programs; the most bytes per device of them.
    def prepare(self, operation: Operation, shape: tuple[int, ...], *, batch: int, output: Output = "uint8",
                framewise: bool = False) -> int: ...

    # Bytes per device a decode run keeps between its steps (its caches); read from the program cache.
    def held_bytes(self, shape: tuple[int, ...], *, batch: int, output: Output = "uint8",
                   framewise: bool = False) -> int: ...

    def free_bytes(self) -> int | None: ...  # memory free per device now (this process's devices)

    def programs(self) -> list[list]: ...

    def program_memory(self) -> list[dict[str, Any]]: ...


# Builds a runner from ``(vae, mesh, max_batch=, dp=)`` (``DeviceRunner``; tests pass runners that fail or stall).
RunnerFactory = Callable[..., Runner]

# The ``Runner`` methods that reach the devices (the others read the program cache): on a
# multi-host slice process 0 makes each of them on every process (``service.slice.member``). Their
# arguments are host arrays and JSON values (tuples travel as lists).
DEVICE_CALLS = ("decode", "decode_stream", "encode", "decode_sound", "encode_sound", "compile", "compile_encode",
                "prepare")


class Cluster(Protocol):
    """This process's place in a multi-host slice (``service.slice.SliceMember``)."""

    @property
    def process_id(self) -> int:
        """This process's rank in the slice."""

    @property
    def num_processes(self) -> int:
        """Processes in the slice, one per host."""

    @property
    def is_leader(self) -> bool:
        """Process 0: it serves HTTP and sends every device call to the others."""

    def follow(self) -> None:
        """A follower's device loop, in the device thread, until process 0 stops the slice."""

    def request_stop(self, reason: str) -> None:
        """A follower was asked to stop (a signal): ask process 0 to stop the whole slice."""

    def leave(self, device_idle: bool) -> None:
        """After the drain: leave the slice in order (process 0 stops the followers first)."""


@dataclass(frozen=True)
class ModelState:
    """What start-up produced; read-only afterwards (built by ``service.engine.startup.load_model``)."""

    name: str  # the id in /v1/models: --model as given, or the model's own name
    vae: Any
    runner: Runner
    limits: Limits
    mean: np.ndarray  # (C,) float32: latents_mean
    std: np.ndarray  # (C,) float32: latents_std
    devices: list[str]
    platform: str
    warmed: tuple[Any, ...]  # the settings' Warmup entries compiled at start-up
    served: ServedShapes | None  # None: any shape (programs compiled on demand, LRU-bounded)
    memory: MemoryPlan | None = None  # how the memory is shared out: what every program must fit per device
    guard: MemoryGuard | None = None  # the checks before compiling (the estimate), and the largest videos
    encode_served: frozenset[tuple[int, ...]] | None = None  # frames (3, F, H, W) encoded; None: any
    cluster: Cluster | None = None  # this process's part in a multi-host slice
    framewise: bool = False  # the model offers diffusers' framewise decode (HunyuanVideo 1.0: framewise=true)
    convs: Convs = "onednn"  # how its programs convolve (models.conv.convs_for): "onednn"/"matmul" on CPU, else "native"
    sound: SoundInfo | None = None  # its sound decoder's sizes and rates (models.sound), where it has one

    @property
    def device_memory_bytes(self) -> int | None:
        """What every program must fit per device (None: unknown, not checked)."""
        return None if self.memory is None else self.memory.device_bytes

    def check_decode_fits(self, shape: tuple[int, ...], output: Output) -> None:
        """``TooLargeForMemory`` when the decode of latents ``shape`` ``(B, C, T, H, W)`` clearly
        cannot fit (the estimate; checked before anything is compiled)."""
        if self.guard is not None:
            self.guard.check_decode(shape, output)

    def check_encode_fits(self, shape: tuple[int, ...]) -> None:
        """``TooLargeForMemory`` when the encode of frames ``shape`` ``(B, 3, F, H, W)`` clearly cannot fit."""
        if self.guard is not None:
            self.guard.check_encode(shape)

    @property
    def follower(self) -> bool:
        """A process of a multi-host slice other than process 0: it serves probes, not requests."""
        return self.cluster is not None and not self.cluster.is_leader

    def serves(self, shape: tuple[int, ...], output: str) -> bool:
        """Latents of ``shape`` (C, T, H, W) are served with ``output`` (``--shapes``)."""
        return self.served is None or output in self.served.get(shape, ())

    def check_served(self, shape: tuple[int, ...], output: str) -> None:
        """``ShapeNotServed`` unless latents of ``shape`` (C, T, H, W) are served with ``output`` (``--shapes``)."""
        if self.served is None or self.serves(shape, output):
            return
        allowed = sorted(f"{shape_text(s)}:{','.join(sorted(o))}" for s, o in self.served.items())
        raise ShapeNotServed(f"latents {shape_text(shape)} with output {output} are not served here (--shapes)",
                             received=f"{shape_text(shape)}:{output}", allowed=allowed)

    def require_encoder(self) -> None:
        """``NoEncoder`` unless the checkpoint has an encoder (answered before the body is read)."""
        if not self.vae.has_encoder:
            raise NoEncoder("the served checkpoint has no encoder weights (encoder.*, quant_conv.*): "
                            "it decodes but cannot encode")

    def check_encode_served(self, shape: tuple[int, ...]) -> None:
        """``ShapeNotServed`` unless frames of ``shape`` (3, F, H, W) are served (``--shapes`` other
        than ``any`` serves only the ``--encode-warmup`` shapes)."""
        if self.encode_served is None or shape in self.encode_served:
            return
        raise ShapeNotServed(f"frames {shape_text(shape)} are not encoded here (--shapes, --encode-warmup)",
                             received=shape_text(shape), allowed=sorted(shape_text(s) for s in self.encode_served))

    def denormalize(self, latents: np.ndarray) -> np.ndarray:
        """``z · latents_std + latents_mean`` per channel of NCTHW (or an image's NCHW) latents, on
        the host (float32)."""
        per_channel = (1, -1) + (1,) * (latents.ndim - 2)
        return latents * self.std.reshape(per_channel) + self.mean.reshape(per_channel)


@dataclass(frozen=True)
class ServedModels:
    """The models one server serves, by name, in the order given (``--model``, repeatable). One
    device thread serves them all, each with its own runner, program cache and limits; their
    programs are checked against one device memory, less the other models' resident weights
    (``ModelState.memory``), and their requests hold one host account. A multi-host slice serves
    one model."""

    by_name: dict[str, ModelState]
    memory: MemoryPlan  # the devices' and the host's memory, before the models' weights share it out

    @property
    def first(self) -> ModelState:
        """The first model given; on a multi-host slice, the only one."""
        return next(iter(self.by_name.values()))

    @property
    def names(self) -> list[str]:
        return list(self.by_name)

    @property
    def cluster(self) -> Cluster | None:
        return self.first.cluster

    @property
    def follower(self) -> bool:
        return self.first.follower

    def find(self, name: str | None) -> ModelState | None:
        """The model ``name`` names (None: the only one served), or None where there is none."""
        if name is None:
            return self.first if len(self.by_name) == 1 else None
        return self.by_name.get(name)

    def choose(self, name: str | None) -> ModelState:
        """The model a request names (``name``; None: the only one served): ``ModelNotServed`` for
        a name not served, ``ModelNotNamed`` when several are served and none is named."""
        model = self.find(name)
        if model is not None:
            return model
        if name is None:
            raise ModelNotNamed(self.names)
        raise ModelNotServed(name, self.names)
