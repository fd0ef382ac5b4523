"""The memory this server runs in, and how it is shared out: the devices' programs and the host's requests.

Read once at start-up (:func:`plan_memory`), no JAX here (the runner reads the devices' own limit):

* the machine: the cgroup limit of this process where one is set (v2 ``memory.max``, v1
  ``memory.limit_in_bytes``, of its cgroup and every ancestor), else ``MemTotal``;
* less ``host_reserve_bytes``, for the process itself (Python, JAX's runtime, the weights as read
  from the checkpoint, the compiler);
* the host account (``host_memory_bytes``): what requests hold on the host (decoded encode inputs,
  decoded frames waiting to be written, MP4 and npy answers, stream buffers). Default: a quarter
  of the rest on CPU, where the devices' programs run in the same memory, half on TPU/GPU hosts;
* per device, what every program must fit before it runs: ``--device-memory-bytes``, else the
  devices' ``bytes_limit`` (TPU/GPU), else on CPU the rest of the host's memory, shared by the
  mesh's devices on this host (they are all this process).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from vaeserve.models.estimate import Estimate, Estimator
from vaeserve.models.shapes import Output, clip_shape, shape_text

from ..limits import Limits
from ..settings import Settings
from .errors import StartupRefused, TooLargeForMemory

# cgroup v1 writes "no limit" as the largest page-aligned 63-bit number.
_V1_UNLIMITED = 2**62


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def process_rss(proc: Path = Path("/proc")) -> int:
    """This process's resident memory in bytes (0 where unreadable)."""
    try:
        for line in (proc / "self" / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass(frozen=True)
class Machine:
    """The memory this process may use at most: ``bytes`` and where that figure came from."""

    bytes: int
    source: str  # "cgroup memory.max", "cgroup memory.limit_in_bytes" or "MemTotal"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # v2 writes "max" for no limit


def meminfo(field: str, proc: Path = Path("/proc")) -> int | None:
    """A field of ``/proc/meminfo`` (``MemTotal``, ``MemAvailable``) in bytes; None where unreadable."""
    try:
        lines = (proc / "meminfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        if name == field:
            number, *unit = value.split()
            return int(number) * (1024 if unit == ["kB"] else 1)
    return None


def _cgroup_paths(proc: Path) -> dict[str, str]:
    """This process's cgroup per hierarchy: ``{"": path}`` for v2, ``{"memory": path}`` for v1."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return {}
    paths = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _lowest(directory: Path, cgroup: str, name: str) -> int | None:
    """The least value of ``name`` in ``cgroup`` and its ancestors under ``directory`` (a limit
    set on a parent holds for its children). A container sees its own cgroup at the mount's root,
    where the path /proc names may not exist: the root is read too."""
    found = []
    parts = [part for part in cgroup.strip("/").split("/") if part]
    for depth in range(len(parts), -1, -1):
        value = _read_int(directory.joinpath(*parts[:depth], name))
        if value is not None:
            found.append(value)
    return min(found) if found else None


def cgroup_limit(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> Machine | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, else v1's
    ``memory.limit_in_bytes``), or None where none is set."""
    paths = _cgroup_paths(proc)
    if "" in paths:
        value = _lowest(cgroup_root, paths[""], "memory.max")
        if value is not None:
            return Machine(value, "cgroup memory.max")
    if "memory" in paths:
        value = _lowest(cgroup_root / "memory", paths["memory"], "memory.limit_in_bytes")
        if value is not None and value < _V1_UNLIMITED:
            return Machine(value, "cgroup memory.limit_in_bytes")
    return None


def machine_memory(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> Machine:
    """The memory this process may use: its cgroup's limit where it is below the host's memory, else
    ``MemTotal``."""
    total = meminfo("MemTotal", proc)
    limit = cgroup_limit(proc, cgroup_root)
    if limit is not None and (total is None or limit.bytes < total):
        return limit
    if total is None:
        raise RuntimeError(f"cannot read the host's memory ({proc / 'meminfo'}); set --host-memory-bytes and "
                           "--device-memory-bytes")
    return Machine(total, "MemTotal")


def available_host_bytes(proc: Path = Path("/proc")) -> int | None:
    """Memory free for use now (``MemAvailable``), for the check a program gets again after it ran
    out of memory."""
    return meminfo("MemAvailable", proc)


@dataclass(frozen=True)
class MemoryPlan:
    """How this server's memory is shared out (see the module docstring).

    ``device_bytes``: what every program must fit per device (None: unknown, nothing is checked —
    an accelerator that reports no limit and no ``--device-memory-bytes``); ``host_bytes``: the
    host account for requests."""

    platform: str
    device_bytes: int | None
    device_source: str
    host_bytes: int
    host_source: str
    machine: Machine | None
    reserve_bytes: int

    def describe(self) -> str:
        """One line for the start-up log."""
        device = ("unknown (not checked)" if self.device_bytes is None
                  else f"{self.device_bytes / 1e9:.2f} GB ({self.device_source})")
        machine = f"{self.machine.bytes / 1e9:.2f} GB ({self.machine.source})" if self.machine else "not read"
        return (f"memory: per device {device}; host account for requests {self.host_bytes / 1e9:.2f} GB "
                f"({self.host_source}); machine {machine}, reserve {self.reserve_bytes / 1e9:.2f} GB")


# The host account's default share of the memory left after the reserve.
CPU_HOST_SHARE = 4  # a quarter: the devices' programs run in the rest
ACCELERATOR_HOST_SHARE = 2  # half: the devices have memory of their own


def plan_memory(settings: Settings, *, platform: str, local_devices: int, device_limit: int | None,
                machine: Machine | None = None) -> MemoryPlan:
    """Share the memory out (module docstring). ``local_devices``: the mesh's devices in this
    process; ``device_limit``: the devices' own ``bytes_limit`` (None on CPU); ``machine``: the
    host's memory (default: read it)."""
    reserve = settings.host_reserve_bytes
    host_given = settings.host_memory_bytes
    cpu = platform == "cpu"
    if machine is None and (host_given is None or (cpu and settings.device_memory_bytes is None)):
        machine = machine_memory()
    usable = max(0, machine.bytes - reserve) if machine is not None else 0
    if host_given is not None:
        host, host_source = host_given, "--host-memory-bytes"
    else:
        host = usable // (CPU_HOST_SHARE if cpu else ACCELERATOR_HOST_SHARE)
        host_source = f"1/{CPU_HOST_SHARE if cpu else ACCELERATOR_HOST_SHARE} of the memory after the reserve"
    if settings.device_memory_bytes is not None:
        device, device_source = settings.device_memory_bytes, "--device-memory-bytes"
    elif device_limit is not None:
        device, device_source = device_limit, "the devices' bytes_limit"
    elif cpu:
        device = max(0, usable - host) // max(1, local_devices)
        device_source = (f"the host's memory after the reserve and the host account, shared by {local_devices} "
                         "device(s)" if local_devices > 1 else "the host's memory after the reserve and the host account")
    else:
        device, device_source = None, "unknown"
    return MemoryPlan(platform=platform, device_bytes=device, device_source=device_source, host_bytes=host,
                      host_source=host_source, machine=machine, reserve_bytes=reserve)


# -- before loading: the weights ---------------------------------------------------------------------
# Loading holds a model's weights twice at its peak: as drawn (an embedded model) or read from the
# checkpoint, and as the model's arrays (or the copy written to the weights cache). Counted in
# float32, what embedded weights are drawn in and what most checkpoints hold. Several models load
# one after another: those loaded stay, so the peak is every model's weights once and the largest's
# other copies.
WEIGHT_COPIES_WHILE_LOADING = 2


def weights_load_bytes(*parameters: int) -> int:
    """What loading models of ``parameters`` each (decoder and encoder), one after another, holds at its peak."""
    return 4 * (sum(parameters) + (WEIGHT_COPIES_WHILE_LOADING - 1) * max(parameters, default=0))


def check_weights_fit(parameters: int | Sequence[int], *, what: str, machine: Machine, in_use: int) -> None:
    """``StartupRefused`` when loading ``what`` (its ``parameters``; a server's several models: each
    one's) cannot fit the memory this process may use (``machine``, of which ``in_use`` bytes are
    taken already): a clear refusal to start, where loading would end in the kernel's out-of-memory kill."""
    each = [parameters] if isinstance(parameters, int) else list(parameters)
    needed, free, total = weights_load_bytes(*each), machine.bytes - in_use, sum(each)
    if needed > free:
        copies = (f"{WEIGHT_COPIES_WHILE_LOADING} float32 copies at its peak" if len(each) == 1 else
                  f"each model's float32 weights, and {WEIGHT_COPIES_WHILE_LOADING} copies of the largest's while "
                  "it loads")
        raise StartupRefused(
            f"{what} {'has' if len(each) == 1 else 'have'} {total / 1e6:.0f} M parameters"
            f"{'' if len(each) == 1 else ' together'}: loading them holds about {_size(needed)} ({copies}), and "
            f"this process may use {_size(free)} more ({_size(machine.bytes)}, {machine.source}, less "
            f"{_size(in_use)} in use): refused before loading")


def beside_other_models(plan: MemoryPlan, weights: int) -> MemoryPlan:
    """``plan`` as one of a server's several models sees it: every device also holds the other models'
    resident ``weights`` (bytes per device; weights are replicated on every device of the mesh), so its
    programs must fit in what they leave."""
    if plan.device_bytes is None or not weights:
        return plan
    return replace(plan, device_bytes=max(0, plan.device_bytes - weights),
                   device_source=f"{plan.device_source}, less {_size(weights)} of the other models' weights")


# -- before compiling: the estimate ------------------------------------------------------------------
# The estimate is within [1/1.5, 1.5] of what a compiled program's memory_analysis() says on the
# configs it is calibrated for (tests/models/test_memory_estimate.py): a request is refused before
# compiling only when even the least its programs could need does not fit. What may fit is
# compiled, and its memory_analysis() decides.
ESTIMATE_MARGIN = 1.5
# The least the estimate has been measured at against memory_analysis() (0.65: the image families
# at some sizes, docs/serving.md; the tests hold every family's tiny configs to >= 0.7). The
# largest videos a server advertises are those whose estimate fits this share of the memory, so
# that their compiled programs fit too: what the server advertises, it serves.
ESTIMATE_LOW = 0.65


@dataclass(frozen=True)
class Video:
    """A video's size: ``frames`` of ``width`` x ``height``, and the estimated bytes per device."""

    width: int
    height: int
    frames: int
    bytes: int
    image: bool = False  # an image model's image (one frame)

    def __str__(self) -> str:
        if self.image:
            return f"an image of {self.width}x{self.height}"
        return f"{self.frames} frame{'s' if self.frames != 1 else ''} of {self.width}x{self.height}"


def _largest(fits: Callable[[int], bool], most: int) -> int:
    """The largest ``k`` in ``[1, most]`` with ``fits(k)`` (``fits`` monotone), or 0."""
    if most < 1 or not fits(1):
        return 0
    low, high = 1, most
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


@dataclass(frozen=True)
class MemoryGuard:
    """The checks a request meets before anything is compiled for it: its programs' estimated bytes
    per device against ``plan.device_bytes`` (``check_decode``, ``check_encode``: refused when even
    ``1 / ESTIMATE_MARGIN`` of the estimate does not fit), with what would fit instead; and the
    largest videos this server can decode and encode (``largest_decode``, ``largest_encode``).
    Without an estimate for the model's family (``estimate`` None) or a known limit, nothing is
    refused here: the compiled programs are checked once compiled (``Runner.prepare``)."""

    plan: MemoryPlan
    estimate: Estimator | None
    limits: Limits
    devices: int  # devices this server's processes hold (what a larger tp could use)
    # (dtype, tp) -> the model's estimate with them, for what would fit
    variants: Callable[[str, int], Estimator | None] = lambda dtype, tp: None

    @property
    def checks(self) -> bool:
        return self.estimate is not None and self.plan.device_bytes is not None

    def _fits(self, estimate: Estimator | None, program: Callable[[Estimator], Estimate], *, margin: float = 1.0) -> bool:
        assert self.plan.device_bytes is not None
        return estimate is None or program(estimate).total <= margin * self.plan.device_bytes

    def check_decode(self, shape: tuple[int, ...], output: Output) -> None:
        """``TooLargeForMemory`` when the decode of latents ``shape`` ``(B, C, T, H, W)`` clearly
        cannot fit the devices."""
        def program(estimate: Estimator) -> Estimate:
            return estimate.decode(shape, output)

        self._check(shape, program, "the decode of latents", self.decode_suggestions(shape, output))

    def check_encode(self, shape: tuple[int, ...]) -> None:
        """``TooLargeForMemory`` when the encode of frames ``shape`` ``(B, 3, F, H, W)`` clearly
        cannot fit the devices."""
        def program(estimate: Estimator) -> Estimate:
            return estimate.encode(shape)

        self._check(shape, program, "the encode of frames", self.encode_suggestions(shape))

    def _check(self, shape: tuple[int, ...], program: Callable[[Estimator], Estimate], what: str,
               suggestions: Callable[[], list[str]]) -> None:
        if not self.checks or self._fits(self.estimate, program, margin=ESTIMATE_MARGIN):
            return
        assert self.estimate is not None and self.plan.device_bytes is not None
        needed, limit = program(self.estimate).total, self.plan.device_bytes
        would_fit = suggestions()
        raise TooLargeForMemory(
            f"{what} {shape_text(shape)} needs an estimated {_size(needed)} per device; {_size(limit)} are "
            f"available ({self.plan.device_source}): refused before compiling"
            + (f"; would fit: {'; '.join(would_fit)}" if would_fit else ""),
            needed=needed, available=limit, received=shape_text(shape), would_fit=would_fit)

    def decode_suggestions(self, shape: tuple[int, ...], output: Output) -> Callable[[], list[str]]:
        def suggest() -> list[str]:
            b, c, t, h, w = clip_shape(shape)  # an image's (B, C, H, W) as its one-frame clip
            s = self.limits.spatial_scale
            found = []
            rows = _largest(lambda k: self._fits(self.estimate, lambda e: e.decode((b, c, t, k, max(1, k * w // h)),
                                                                                  output)), h - 1)
            if rows:
                found.append(self._said(s * max(1, rows * w // h), s * rows, self.limits.output_frames(t)))
            frames = _largest(lambda k: self._fits(self.estimate, lambda e: e.decode((b, c, k, h, w), output)), t - 1)
            if frames:
                found.append(self._said(s * w, s * h, self.limits.output_frames(frames)))
            return found + self._variants(lambda e: e.decode(shape, output))
        return suggest

    def encode_suggestions(self, shape: tuple[int, ...]) -> Callable[[], list[str]]:
        def suggest() -> list[str]:
            b, c, f, h, w = clip_shape(shape)  # an image's (B, 3, H, W) as its one-frame clip
            s = self.limits.spatial_scale
            found = []
            rows = _largest(lambda k: self._fits(self.estimate, lambda e: e.encode((b, c, f, s * k, s * max(1, k * w // h)))),
                            h // s - 1)
            if rows:
                found.append(self._said(s * max(1, rows * w // h), s * rows, f))
            step = self.limits.encode_step
            chunks = _largest(lambda k: self._fits(self.estimate, lambda e: e.encode((b, c, 1 + step * k, h, w))),
                              (f - 1) // step - 1)
            if chunks:
                found.append(self._said(w, h, 1 + step * chunks))
            return found + self._variants(lambda e: e.encode(shape))
        return suggest

    def _said(self, width: int, height: int, frames: int) -> str:
        return str(Video(width, height, frames, 0, image=self.limits.images))

    def _variants(self, program: Callable[[Estimator], Estimate]) -> list[str]:
        """A larger tp or bfloat16 that would fit, where this server could offer them."""
        assert self.estimate is not None
        found = []
        tp, dtype = self.estimate.tp, self.estimate.dtype
        more = tp * 2
        while more * self.estimate.dp <= self.devices:
            if self._fits(self.variants(dtype, more), program):
                found.append(f"tp={more} (serve with --tp {more} --dp {max(1, self.devices // more)})")
                break
            more *= 2
        if dtype == "float32" and self._fits(self.variants("bfloat16", tp), program):
            found.append("bfloat16 (serve with --dtype bfloat16)")
        return found

    def largest_decode(self) -> list[Video]:
        """The largest videos this server can decode with its memory, by the estimate (within
        ``ESTIMATE_LOW`` of the memory, the share its least ratio to the compiled figure leaves): at the most
        frames served, the largest frame of the served aspect (``max_height x max_width``); and at
        the largest frame served, the most frames. Empty without an estimate or a limit."""
        if not self.checks:
            return []
        limits = self.limits
        c, t = limits.channels, limits.max_latent_frames
        h, w = limits.max_latent_height, limits.max_latent_width
        return self._largest_videos(lambda rows, cols, frames: (1, c, frames, rows, cols), t, h, w,
                                    lambda e, s: e.decode(s), limits.output_frames)

    def largest_encode(self) -> list[Video]:
        """As ``largest_decode``, for the encode (the frames of the videos it takes)."""
        if not self.checks:
            return []
        limits = self.limits
        s, step = limits.spatial_scale, limits.encode_step
        chunks = (limits.max_frames - 1) // step
        return self._largest_videos(lambda rows, cols, k: (1, 3, 1 + step * k, s * rows, s * cols), chunks,
                                    limits.max_latent_height, limits.max_latent_width, lambda e, sh: e.encode(sh),
                                    lambda k: 1 + step * k, first=0)

    def _largest_videos(self, shape: Callable[[int, int, int], tuple[int, ...]], frames: int, rows: int, cols: int,
                        program: Callable[[Estimator, tuple[int, ...]], Estimate], frames_of: Callable[[int], int],
                        first: int = 1) -> list[Video]:
        estimate, s = self.estimate, self.limits.spatial_scale
        assert estimate is not None

        def video(r: int, c: int, k: int) -> Video:
            return Video(s * c, s * r, frames_of(k), program(estimate, shape(r, c, k)).total, image=self.limits.images)

        def fits(r: int, c: int, k: int) -> bool:
            return video(r, c, k).bytes <= ESTIMATE_LOW * (self.plan.device_bytes or 0)

        found = []
        best = _largest(lambda r: fits(r, max(1, r * cols // rows), frames), rows)
        if best:
            found.append(video(best, max(1, best * cols // rows), frames))
        if best < rows:
            most = _largest(lambda k: fits(rows, cols, k - 1 + first), frames + 1 - first) - 1 + first
            if most >= first and (first or most):
                found.append(video(rows, cols, most))
        return found
