"""One cache of compiled programs per model: ahead-of-time compiles, least recently used out.

Every decode program (single-device or sharded, whole decode or stream step) is lowered and
compiled explicitly (``jax.jit(...).lower(...).compile()``) and kept here under a key that names
the program, its target devices, its input shape and its options. Explicit compiles are what make
``memory_analysis()`` available before a program runs, give an honest count of real compiles, and
let a server bound how many programs it keeps (``max_entries``).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Hashable
from typing import Literal, NamedTuple

import jax

# The programs a model compiles, named as ``/v1/models`` lists them.
ProgramName = Literal["decode", "stream-step", "encode"]


class ProgramKey(NamedTuple):
    """The key of a compiled program in ``ProgramCache``: which program, for which devices and
    input, and every other argument it was compiled with.

    Attributes:
      program: ``"decode"`` (a whole decode), ``"stream-step"`` (one step of a streamed decode)
        or ``"encode"``.
      mesh: ``sharding.mesh.mesh_key`` of the mesh it runs on; None for a single-device program.
      shape: its input, latents ``(B, C, T, H, W)`` or frames ``(B, 3, F, H, W)``.
      variant: what it returns: the output (``"float"`` | ``"uint8"``) of a decode; ``"first"``
        (latent frame 0, from empty caches) or ``"next"`` for a stream step; ``"latents"`` for an
        encode.
      options: the other arguments that change the program (band plan, denormalize, chunk, halo,
        query chunk) as sorted ``(name, value)`` pairs: they only tell programs apart.
    """

    program: ProgramName
    mesh: Hashable | None
    shape: tuple[int, ...]
    variant: str
    options: tuple[tuple[str, Hashable], ...] = ()

    def describe(self) -> list:
        """``[program, [B, C, T, H, W], variant]``: the program as ``/v1/models`` lists it. The one
        option a client chooses per request, HunyuanVideo 1.0's framewise decode, is named in the
        variant (``"uint8+framewise"``); the others follow from the server's settings."""
        framewise = "+framewise" if ("framewise", True) in self.options else ""
        return [self.program, list(self.shape), self.variant + framewise]


def program_key(program: ProgramName, shape: tuple[int, ...], variant: str, *, mesh: Hashable | None = None,
                **options: Hashable) -> ProgramKey:
    """A ``ProgramKey`` with ``options`` in a fixed (sorted) order."""
    return ProgramKey(program, mesh, tuple(shape), variant, tuple(sorted(options.items())))


class ProgramCache:
    """Compiled programs by key (a ``ProgramKey`` for the models' programs); beyond
    ``max_entries`` the least recently used one is dropped.

    Attributes:
      max_entries: how many compiled programs to keep (None: all).
      compiles: real XLA compiles made through this cache.
      evictions: programs dropped to stay within ``max_entries``.
      compile_seconds: total time spent compiling.
      on_compile: called as ``on_compile(key, seconds)`` after each compile.
      on_evict: called as ``on_evict(key)`` after each eviction.
    """

    def __init__(self, max_entries: int | None = None):
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be ≥ 1 or None; received {max_entries}")
        self.max_entries = max_entries
        self.compiles = 0
        self.evictions = 0
        self.compile_seconds = 0.0
        self.on_compile: Callable[[Hashable, float], None] | None = None
        self.on_evict: Callable[[Hashable], None] | None = None
        self._entries: collections.OrderedDict[Hashable, jax.stages.Compiled] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, lower: Callable[[], jax.stages.Lowered]) -> jax.stages.Compiled:
        """The compiled program for ``key``, compiling ``lower()`` on a miss."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        start = time.perf_counter()
        compiled = lower().compile()
        seconds = time.perf_counter() - start
        evicted = []
        with self._lock:
            self._entries[key] = compiled
            self.compiles += 1
            self.compile_seconds += seconds
            while self.max_entries is not None and len(self._entries) > self.max_entries:
                evicted.append(self._entries.popitem(last=False)[0])
                self.evictions += 1
        if self.on_compile is not None:
            self.on_compile(key, seconds)
        for old in evicted:
            if self.on_evict is not None:
                self.on_evict(old)
        return compiled

    def peek(self, key: Hashable) -> jax.stages.Compiled | None:
        """The compiled program for ``key`` if held, without marking it used (for inspection)."""
        with self._lock:
            return self._entries.get(key)

    def keys(self) -> list[Hashable]:
        """Keys of the programs held, least recently used first."""
        with self._lock:
            return list(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
