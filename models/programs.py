"""One cache of compiled programs per model: ahead-of-time compiles, least recently used out.

Every program (on one device or a mesh; whole decode, stream step or encode) is lowered and
compiled explicitly (``jax.jit(...).lower(...).compile()``) and kept here under a key that names
the program, its target devices, its input shape and its options. Explicit compiles are what make
``memory_analysis()`` available before a program runs, give an honest count of real compiles, and
let a server bound how many programs it keeps (``max_entries``).

A server also gives the cache a ``check`` (its memory guard): every program compiled here is
checked before anyone can run it, and a program the check refuses is not kept — the refusal is,
so the same key is refused at once next time, without compiling again.
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
      mesh: ``sharding.mesh.mesh_key`` of the mesh it runs on (one device: a 1x1 mesh).
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
        """``[program, [B, C, T, H, W], variant]``: the program as ``/v1/models`` lists it. What a
        client chooses per request is named in the variant: a stream step's float frames
        (``"next+float"``: ``pt`` tensors; uint8 steps serve every other answer) and HunyuanVideo
        1.0's framewise decode (``"uint8+framewise"``); a first step built for the clip's length says
        for which (``"first+clip=3"``, HunyuanVideo 1.5) or up to which (``"first+clips<=4"``, LTX: the
        length taken at run time); the others follow from the server's settings."""
        options = dict(self.options)
        float_step = "+float" if options.get("output") == "float" else ""
        framewise = "+framewise" if options.get("framewise") is True else ""
        clip = ""  # a first step built for the clip's length: for that clip, or for clips up to it
        if self.variant == "first" and "clip_frames" in options:
            clip = f"+clips<={options['clip_frames']}" if options.get("clip_at_run_time") is True else f"+clip={options['clip_frames']}"
        return [self.program, list(self.shape), self.variant + float_step + framewise + clip]


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
      check: called as ``check(key, compiled)`` after each compile, before the program is kept or
        returned; the exception it raises refuses the program, now and for every later ``get`` of
        the key (the last ``MAX_REFUSALS`` refusals are kept).
    """

    MAX_REFUSALS = 1024

    def __init__(self, max_entries: int | None = None):
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be ≥ 1 or None; received {max_entries}")
        self.max_entries = max_entries
        self.compiles = 0
        self.evictions = 0
        self.compile_seconds = 0.0
        self.on_compile: Callable[[Hashable, float], None] | None = None
        self.on_evict: Callable[[Hashable], None] | None = None
        self.check: Callable[[Hashable, jax.stages.Compiled], None] | None = None
        self._entries: collections.OrderedDict[Hashable, jax.stages.Compiled] = collections.OrderedDict()
        self._refused: collections.OrderedDict[Hashable, Exception] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, lower: Callable[[], jax.stages.Lowered]) -> jax.stages.Compiled:
        """The compiled program for ``key``, compiling ``lower()`` on a miss; the ``check``'s
        exception for a key it refused (at once, after the first time)."""
        with self._lock:
            refusal = self._refused.get(key)
            if refusal is not None:
                raise refusal.with_traceback(None)
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        start = time.perf_counter()
        compiled = lower().compile()
        seconds = time.perf_counter() - start
        if self.check is not None:
            try:
                self.check(key, compiled)
            except Exception as refused:
                self._refuse(key, refused, seconds)
                raise
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

    def _refuse(self, key: Hashable, refusal: Exception, seconds: float) -> None:
        """Keep ``refusal`` for ``key`` instead of its program (which is dropped: nobody may run it)."""
        with self._lock:
            self._refused[key] = refusal
            while len(self._refused) > self.MAX_REFUSALS:
                self._refused.popitem(last=False)
            self.compiles += 1
            self.compile_seconds += seconds
        if self.on_compile is not None:
            self.on_compile(key, seconds)

    def refused(self, key: Hashable) -> Exception | None:
        """The refusal kept for ``key``, if its program was refused."""
        with self._lock:
            return self._refused.get(key)

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
            self._refused.clear()
