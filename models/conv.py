"""The convolutions of the Wan VAE as pure functions, channels-last.

Two implementations of each, chosen by the caller (``native``): the native XLA convolution, for
accelerators, and on CPU a nine-tap matmul plus shifted sums, computed in blocks of frames or
rows under a byte budget. Both are exact to float32 rounding (``tests/models/test_numerics.py``).
"""

from __future__ import annotations

import math
from typing import TypedDict, cast

import jax
import jax.numpy as jnp
from jax import lax

from .estimate import CPU_BLOCK_BYTES, Convs
from .spatial import matmul_precision

CACHE_FRAMES = 2
_RMS_EPS = 1e-12  # torch.nn.functional.normalize's eps


# On CPU a conv whose temporary buffers (nine tap outputs, folded time taps) would exceed
# CPU_BLOCK_BYTES runs as a loop over groups of frames, or over blocks of rows of one frame, writing
# into one output buffer: a 480x832 decode then holds tens of MB of such buffers instead of
# 9x copies of its largest activation (≈ 5 GB each).
# On CPU a 3x3(x3) conv whose kernel outweighs its frames (``weight_bound``) runs as one im2col
# matmul against the kernel as stored: the nine-tap matmul's kernel layout costs a copy of the
# kernel per call, which at 1024 channels (113 MB in float32) takes longer than the conv itself.
# The columns then hold at most 27·C·2·O values: twice the kernel.
IM2COL_PIXELS_PER_CHANNEL = 2
IM2COL_MIN_KERNEL_BYTES = 4 * 2**20


def native_conv_for(platform: str) -> bool:
    """Native XLA convolutions on every platform but CPU (where the nine-tap matmul is 1.5x faster
    than XLA's own convolution, and oneDNN's, ``onednn_conv_for``, faster still).

    Chosen from the platform of the devices a program is *compiled for*, not the host's default
    backend, so a TPU program compiled ahead of time on a CPU host is the one the chip will run.
    """
    return platform != "cpu"


# How CPU programs run their convolutions (``VAE.cpu_convs``): "matmul", the nine-tap matmuls and
# im2col (the default, which the memory estimate, ``models.estimate``, is fitted to), or "onednn".
CPU_CONVS = ("matmul", "onednn")


def onednn_conv_for(platform: str, cpu_convs: str) -> bool:
    """Whether a CPU program runs its convolutions as oneDNN's (XLA's ``__onednn$convolution``, the
    library PyTorch's CPU convolutions call): on the decoders' shapes XLA's own CPU convolution
    reaches 75–110 GFLOP/s, the nine-tap matmul 90–120, oneDNN's 180–190 (2 cores, AVX-512). It
    needs the program compiled with ``compiler_options_for``; compiled without them, the same
    program runs XLA's own convolution: the same values, slower. Convs bound by their kernels stay
    on the im2col path (``weight_bound``): oneDNN would reorder the kernel on every call. The
    upsamplers keep their phase convs (4/9 of the FLOPs: faster than oneDNN's conv of the
    ``4·O``-output phase kernel, 0.25 s against 0.33 s at 128 channels of 64x64; ``bench/conv.py``)."""
    return platform == "cpu" and cpu_convs == "onednn"


def compiler_options_for(platform: str, cpu_convs: str) -> dict[str, bool]:
    """The XLA compiler options of programs compiled for ``platform``'s devices (``jax.jit``'s
    ``compiler_options``): oneDNN's convolutions where ``onednn_conv_for``."""
    if onednn_conv_for(platform, cpu_convs):
        return {"xla_cpu_use_onednn": True, "xla_cpu_experimental_onednn_custom_call": True}
    return {}


def rounded_conv_sums_for(platform: str) -> bool:
    """Whether native convolutions return their sums rounded to the operands' type (bfloat16),
    the bias then added to that: on GPUs, where cuDNN has no bfloat16 convolution with float32
    outputs. Asked for one, XLA converts the operands to float32 and cuDNN convolves in TF32
    between layout transposes, at about half the speed of its bfloat16 kernels (measured on an
    H100: 4.6 s of convs and 1.2 s of transposes in Wan 2.2's 7.9 s decode). cuDNN's bfloat16
    conv still sums in float32, and XLA fuses the bias into it (``convBiasActivationForward``):
    one rounding, at its output. A TPU's conv unit sums bfloat16 into float32 natively: there the
    float32 sums are kept, as on CPU."""
    return platform == "gpu"


class ConvPath(TypedDict):
    """How a program's convolutions run, as a ``SpatialContext`` takes it (``conv_path_for``)."""

    native_conv: bool
    rounded_conv_sums: bool
    onednn_conv: bool


def conv_path_for(platform: str, cpu_convs: str) -> ConvPath:
    """The conv path of programs compiled for ``platform``'s devices (with ``compiler_options_for``)."""
    return ConvPath(native_conv=native_conv_for(platform), rounded_conv_sums=rounded_conv_sums_for(platform),
                    onednn_conv=onednn_conv_for(platform, cpu_convs))


def convs_for(platform: str, cpu_convs: str) -> Convs:
    """How programs compiled for ``platform``'s devices convolve, in one word: ``cpu_convs`` on CPU
    (``CPU_CONVS``), ``"native"`` elsewhere (``models.estimate.Convs``: the estimate's tables)."""
    return "native" if native_conv_for(platform) else cast(Convs, cpu_convs)


def runs_native(*, native: bool, onednn: bool, pixels: int, kernel: jax.Array) -> bool:
    """Whether a conv producing ``pixels`` output pixels runs as XLA's convolution: always on
    accelerators (``native``); on CPU with oneDNN (``onednn``) unless it is bound by its kernel."""
    return native or (onednn and not weight_bound(pixels, kernel))


def sums_type(dtype, *, rounded: bool):
    """The type a native conv of ``dtype`` operands returns (``rounded_conv_sums_for``)."""
    return dtype if rounded else jnp.float32


def _tap_matmul_conv(x_padded: jax.Array, kernel: jax.Array) -> jax.Array:
    """All nine taps as one matmul ``(C, 9·O)``, then the sum of the nine shifted results.

    ``(N, H+2, W+2, C)`` x ``(3, 3, C, O)`` → float32 ``(N, H, W, O)``.
    """
    n, hp, wp, c = x_padded.shape
    o = kernel.shape[-1]
    taps = jnp.einsum("nhwc,co->nhwo", x_padded, kernel.transpose(2, 0, 1, 3).reshape(c, 9 * o),
                      precision=matmul_precision(x_padded.dtype),
                      preferred_element_type=jnp.float32).reshape(n, hp, wp, 3, 3, o)
    h, w = hp - 2, wp - 2
    # sum() starts from the int 0; nine terms make it an array (typed so for the checker).
    return cast(jax.Array, sum(taps[:, dy : dy + h, dx : dx + w, dy, dx] for dy in range(3) for dx in range(3)))


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, n + 1) if n % d == 0 and d <= max(1, limit))


def conv_blocks(fn, seq: jax.Array, *, window: int, out_channels: int, bytes_per_frame_row: int,
                block_bytes: int, scale: int = 1) -> jax.Array:
    """Apply a frame-local conv ``fn`` block by block over padded frames.

    ``seq`` is ``(B, T + window - 1, H+2, W+2, C)``; output frame ``t`` depends on input frames
    ``[t, t + window)``. ``fn`` maps a block ``(B, G + window - 1, R+2, W+2, C)`` to its output
    ``(B, G, s·R, s·W, O)`` (``s = scale``) in ``seq``'s dtype. Blocks hold ``G`` frames when a frame fits ``block_bytes``,
    else one frame and ``R`` rows (2 rows of overlap; the last block is shifted up to end at H, and
    overlapping rows are written twice with the same values).
    """
    b, span, hp, wp, _ = seq.shape
    frames, h, w = span - window + 1, hp - 2, wp - 2
    frame_bytes = bytes_per_frame_row * hp
    if frames * frame_bytes <= block_bytes:
        return fn(seq)
    if frame_bytes <= block_bytes:
        group, rows = _largest_divisor_at_most(frames, block_bytes // frame_bytes), h
    else:
        most_rows = min(h, max(8, block_bytes // bytes_per_frame_row - 2))
        # Equal blocks: the last one, shifted up to end at H, then recomputes only a few rows.
        group, rows = 1, -(-h // -(-h // most_rows))
    row_blocks = -(-h // rows)

    def body(i, out):
        t = (i // row_blocks) * group
        r = jnp.minimum((i % row_blocks) * rows, h - rows)
        block = lax.dynamic_slice(seq, (0, t, r, 0, 0), (b, group + window - 1, rows + 2, wp, seq.shape[-1]))
        return lax.dynamic_update_slice(out, fn(block), (0, t, scale * r, 0, 0))

    out = jnp.zeros((b, frames, scale * h, scale * w, out_channels), seq.dtype)
    return lax.fori_loop(0, (frames // group) * row_blocks, body, out)


def conv2d_frames(x_padded: jax.Array, kernel: jax.Array, bias: jax.Array, *,
                  block_bytes: int = CPU_BLOCK_BYTES, native: bool, rounded_sums: bool = False,
                  onednn: bool = False) -> jax.Array:
    """3x3 'valid' conv of every frame. ``(B, T, H+2, W+2, C)`` x ``(3, 3, C, O)`` → ``(B, T, H, W, O)``.

    On CPU, XLA's convolution reaches 55–95 GFLOP/s on the decoder's shapes while its matmul reaches
    150–350: there the conv is a nine-tap matmul (3–4x faster), in blocks (``conv_blocks``).
    Accelerators keep the native convolution (cuDNN / the TPU conv unit). Sums are float32 until
    the bias is added: one bfloat16 rounding per conv (``rounded_sums``: the sums are rounded first).
    """
    b, t, hp, wp, c = x_padded.shape
    o = kernel.shape[-1]
    if runs_native(native=native, onednn=onednn, pixels=b * t * (hp - 2) * (wp - 2), kernel=kernel):
        y = lax.conv_general_dilated(x_padded.reshape(b * t, hp, wp, c), kernel, (1, 1), "VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     precision=matmul_precision(x_padded.dtype),
                                     preferred_element_type=sums_type(x_padded.dtype, rounded=rounded_sums))
        return (y + bias).astype(x_padded.dtype).reshape(b, t, hp - 2, wp - 2, o)
    if weight_bound(b * t * (hp - 2) * (wp - 2), kernel):
        return (_im2col_conv(x_padded, kernel[None]) + bias).astype(x_padded.dtype)

    def conv(block):
        bb, g, rp, _, _ = block.shape
        y = _tap_matmul_conv(block.reshape(bb * g, rp, wp, c), kernel)
        return (y + bias).astype(x_padded.dtype).reshape(bb, g, rp - 2, wp - 2, o)

    return conv_blocks(conv, x_padded, window=1, out_channels=o,
                       bytes_per_frame_row=b * wp * (9 * o + c) * 4, block_bytes=block_bytes)


# Nearest 2x upsampling followed by a 3x3 conv, seen from the low-resolution input: output pixel
# (2i+a, 2j+b) reads input rows i+r for r in PHASE_ROWS[a] (and columns likewise), with the kernel
# rows that land there summed. Each output phase is a 2x2 conv of the input: 4/9 of the FLOPs, and
# the 4x larger upsampled activation never exists.
PHASE_ROWS = ({-1: (0,), 0: (1, 2)}, {0: (0, 1), 1: (2,)})  # phase -> input offset -> kernel rows


def _phase_terms(kernel: jax.Array) -> list[tuple[int, int, int, int, jax.Array]]:
    """``(r, c, a, b, weight (C, O))`` for every input offset (r, c) each output phase (a, b) reads."""
    terms: list[tuple[int, int, int, int, jax.Array]] = []
    for r in (-1, 0, 1):
        for c in (-1, 0, 1):
            for a in (0, 1):
                for b in (0, 1):
                    if r in PHASE_ROWS[a] and c in PHASE_ROWS[b]:
                        weight = cast(jax.Array, sum(kernel[ky, kx] for ky in PHASE_ROWS[a][r] for kx in PHASE_ROWS[b][c]))
                        terms.append((r, c, a, b, weight))
    return terms


def _phases_to_pixels(phases: dict[tuple[int, int], jax.Array]) -> jax.Array:
    """``{(a, b): (N, h, w, O)}`` → ``(N, 2h, 2w, O)`` with phase (a, b) at pixel (2i+a, 2j+b)."""
    rows = [jnp.stack([phases[a, 0], phases[a, 1]], axis=3) for a in (0, 1)]  # (N, h, w, 2, O)
    n, h, w, _, o = rows[0].shape
    return jnp.stack(rows, axis=2).reshape(n, 2 * h, 2 * w, o)


def _upsample_tap_matmul_conv(x_padded: jax.Array, kernel: jax.Array) -> jax.Array:
    """CPU: the 16 (offset, phase) weights as one matmul ``(C, 16·O)``, then shifted sums per phase.

    ``(N, h+2, w+2, C)`` low-resolution padded input → float32 ``(N, 2h, 2w, O)``.
    """
    n, hp, wp, c = x_padded.shape
    h, w, o = hp - 2, wp - 2, kernel.shape[-1]
    terms = _phase_terms(kernel)
    weights = jnp.stack([t[-1] for t in terms], axis=1).reshape(c, len(terms) * o)
    taps = jnp.einsum("nhwc,co->nhwo", x_padded, weights, precision=matmul_precision(x_padded.dtype),
                      preferred_element_type=jnp.float32).reshape(n, hp, wp, len(terms), o)
    phases: dict[tuple[int, int], jax.Array] = {}
    for index, (r, cc, a, b, _) in enumerate(terms):
        shifted = taps[:, 1 + r : 1 + r + h, 1 + cc : 1 + cc + w, index]
        phases[a, b] = shifted if (a, b) not in phases else phases[a, b] + shifted
    return _phases_to_pixels(phases)


def _phase_kernel(kernel: jax.Array) -> jax.Array:
    """A 3x3 kernel ``(3, 3, C, O)`` of the upsampled frame as the 3x3 kernel ``(3, 3, C, 4·O)`` of
    the low-resolution one: output channels ordered (row phase, column phase, O), zeros in the taps
    a phase does not read."""
    c, o = kernel.shape[2:]
    full = jnp.zeros((3, 3, c, 2, 2, o), jnp.float32)
    for r, cc, a, bb, weight in _phase_terms(kernel.astype(jnp.float32)):
        full = full.at[r + 1, cc + 1, :, a, bb].set(weight)
    return full.reshape(3, 3, c, 4 * o).astype(kernel.dtype)


def _phase_channels_to_pixels(y: jax.Array) -> jax.Array:
    """``(N, h, w, 4·O)`` (channels ordered as ``_phase_kernel``'s) → ``(N, 2h, 2w, O)``."""
    n, h, w, o4 = y.shape
    y = y.reshape(n, h, w, 2, 2, o4 // 4)
    return _phases_to_pixels({(a, bb): y[:, :, :, a, bb] for a in (0, 1) for bb in (0, 1)})


def upsample2x_conv2d_frames(x_padded: jax.Array, kernel: jax.Array, bias: jax.Array, *,
                             block_bytes: int = CPU_BLOCK_BYTES, native: bool,
                             rounded_sums: bool = False) -> jax.Array:
    """``conv3x3(zero_pad(upsample_nearest_2x(x)))`` computed from the padded low-resolution frames.

    ``(B, T, h+2, w+2, C)`` x ``(3, 3, C, O)`` → ``(B, T, 2h, 2w, O)``. The one-row padding (or halo)
    of the low-resolution input is exactly what the upsampled input's padding would hold.
    """
    b, t, hp, wp, c = x_padded.shape
    o = kernel.shape[-1]
    if native:
        # Native conv over the low-resolution input with 4·O outputs, then depth-to-space.
        y = lax.conv_general_dilated(x_padded.reshape(b * t, hp, wp, c), _phase_kernel(kernel),
                                     (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     precision=matmul_precision(x_padded.dtype),
                                     preferred_element_type=sums_type(x_padded.dtype, rounded=rounded_sums))
        y = _phase_channels_to_pixels(y.reshape(b * t, hp - 2, wp - 2, 4 * o))
        return (y + bias).astype(x_padded.dtype).reshape(b, t, 2 * (hp - 2), 2 * (wp - 2), o)

    def conv(block):
        bb, g, rp, _, _ = block.shape
        y = _upsample_tap_matmul_conv(block.reshape(bb * g, rp, wp, c), kernel)
        return (y + bias).astype(x_padded.dtype).reshape(bb, g, 2 * (rp - 2), 2 * (wp - 2), o)

    return conv_blocks(conv, x_padded, window=1, out_channels=o, scale=2,
                       bytes_per_frame_row=b * wp * (16 * o + 5 * c) * 4, block_bytes=block_bytes)


_DIMENSIONS_3D = ("NDHWC", "DHWIO", "NDHWC")


def _native_causal(past: jax.Array | None, x_padded: jax.Array, kernel: jax.Array, *, start: str,
                   strides: tuple[int, int, int] = (1, 1, 1), rounded_sums: bool) -> jax.Array:
    """The native 3-D conv (no bias; float32 sums, or with ``rounded_sums`` the operands' type) of
    ``past ++ x_padded`` — or, at the clip's start (``past`` None), of ``x_padded`` padded in time by
    two zero frames *inside* the conv (no copy of the clip is made), plus, for ``start="replicate"``,
    the first frame times the time taps that read the padding (which holds copies of it)."""
    precision, sums = matmul_precision(x_padded.dtype), sums_type(x_padded.dtype, rounded=rounded_sums)
    if past is not None:
        return lax.conv_general_dilated(jnp.concatenate([past, x_padded], axis=1), kernel, strides, "VALID",
                                        dimension_numbers=_DIMENSIONS_3D, precision=precision,
                                        preferred_element_type=sums)
    y = lax.conv_general_dilated(x_padded, kernel, strides, ((CACHE_FRAMES, 0), (0, 0), (0, 0)),
                                 dimension_numbers=_DIMENSIONS_3D, precision=precision,
                                 preferred_element_type=sums)
    if start == "replicate":
        for frame in range(min(CACHE_FRAMES, y.shape[1])):
            taps = [i for i in range(kernel.shape[0]) if strides[0] * frame + i < CACHE_FRAMES]
            if taps:
                summed = kernel[taps[0]] if len(taps) == 1 else kernel[taps[0]] + kernel[taps[1]]
                extra = lax.conv_general_dilated(x_padded[:, :1], summed[None], (1, *strides[1:]), "VALID",
                                                 dimension_numbers=_DIMENSIONS_3D, precision=precision,
                                                 preferred_element_type=sums)
                y = y.at[:, frame].add(extra[:, 0])
    return y


def _sequence(past: jax.Array | None, x_padded: jax.Array, start: str) -> jax.Array:
    """``past ++ x_padded`` (the clip's start: zeros or copies of its first frame before it)."""
    return jnp.concatenate([initial_past(x_padded, start) if past is None else past, x_padded], axis=1)


def weight_bound(pixels: int, kernel: jax.Array) -> bool:
    """Whether a CPU conv producing ``pixels`` output pixels is bound by its kernel (``(3, 3, 3, C, O)``
    or ``(3, 3, C, O)``) rather than by its frames: a large kernel (``IM2COL_MIN_KERNEL_BYTES``) and
    at most ``IM2COL_PIXELS_PER_CHANNEL · O`` pixels — a deep layer at a low resolution, or a stream
    step of one frame. The nine-tap matmul would copy the kernel into its own layout on every
    call, and that copy would take longer than the matmul."""
    return (pixels <= IM2COL_PIXELS_PER_CHANNEL * kernel.shape[-1]
            and math.prod(kernel.shape) * kernel.dtype.itemsize >= IM2COL_MIN_KERNEL_BYTES)


def _im2col_conv(seq: jax.Array, kernel: jax.Array) -> jax.Array:
    """Every tap of every output pixel side by side, times the kernel as it is stored, ``(taps·C, O)``
    (a reshape, no copy): ``seq (B, T+kt−1, H+2, W+2, C)`` x ``(kt, 3, 3, C, O)`` → float32
    ``(B, T, H, W, O)`` (``kt`` may be 1: a conv of each frame)."""
    b, span, hp, wp, c = seq.shape
    kt, kh, kw = kernel.shape[:3]
    t, h, w = span - kt + 1, hp - kh + 1, wp - kw + 1
    columns = jnp.concatenate([seq[:, dt : dt + t, dy : dy + h, dx : dx + w]
                               for dt in range(kt) for dy in range(kh) for dx in range(kw)], axis=-1)
    return jnp.einsum("bthwk,ko->bthwo", columns, kernel.reshape(kt * kh * kw * c, -1),
                      precision=matmul_precision(seq.dtype), preferred_element_type=jnp.float32)


def causal_conv3x3x3(past: jax.Array | None, x_padded: jax.Array, kernel: jax.Array, bias: jax.Array, *,
                     start: str = "zero", block_bytes: int = CPU_BLOCK_BYTES, native: bool,
                     rounded_sums: bool = False, onednn: bool = False) -> jax.Array:
    """Causal 3x3x3 conv: frames ``(B, T, H+2, W+2, C)`` after their past ``(B, 2, H+2, W+2, C)``
    (None at the clip's start: two zero frames, or with ``start="replicate"`` two copies of the first).

    Returns ``(B, T, H, W, O)`` for a kernel ``(3, 3, 3, C, O)``. On CPU the three time taps are
    folded into channels (one nine-tap matmul over 3C channels) block by block; accelerators run
    the native 3-D convolution.
    """
    b, t, hp, wp, c = x_padded.shape
    kt, kh, kw, _, o = kernel.shape
    if runs_native(native=native, onednn=onednn, pixels=b * t * (hp - 2) * (wp - 2), kernel=kernel):
        sums = _native_causal(past, x_padded, kernel, start=start, rounded_sums=rounded_sums)
        return (sums + bias).astype(x_padded.dtype)
    seq = _sequence(past, x_padded, start)
    if weight_bound(b * t * (hp - 2) * (wp - 2), kernel):
        return (_im2col_conv(seq, kernel) + bias).astype(x_padded.dtype)
    folded = kernel.transpose(1, 2, 0, 3, 4).reshape(kh, kw, kt * c, o)

    def conv(block):
        bb, span, rp, _, _ = block.shape
        g = span - kt + 1
        stacked = jnp.concatenate([block[:, i : i + g] for i in range(kt)], axis=-1)
        y = _tap_matmul_conv(stacked.reshape(bb * g, rp, wp, kt * c), folded)
        return (y + bias).astype(x_padded.dtype).reshape(bb, g, rp - 2, wp - 2, o)

    return conv_blocks(conv, seq, window=kt, out_channels=o,
                       bytes_per_frame_row=b * wp * (9 * o + (kt + 1) * c) * 4, block_bytes=block_bytes)


def upsample2x_causal_conv3x3x3(past: jax.Array | None, x_padded: jax.Array, kernel: jax.Array, bias: jax.Array,
                                *, start: str = "zero", block_bytes: int = CPU_BLOCK_BYTES,
                                native: bool, rounded_sums: bool = False) -> jax.Array:
    """``causal_conv3x3x3`` of the nearest-2x spatially upsampled frames, from the padded
    low-resolution ones (HunyuanVideo's upsampler): ``past (B, 2, h+2, w+2, C)`` or None (the
    clip's start, as in ``causal_conv3x3x3``), ``x_padded (B, T, h+2, w+2, C)``, kernel
    ``(3, 3, 3, C, O)`` → ``(B, T, 2h, 2w, O)``.

    Each time tap is ``upsample2x_conv2d_frames``' phase trick: the 4x larger upsampled input never
    exists. Accelerators run one native 3-D conv with ``4·O`` outputs; on CPU the time taps are
    folded into channels block by block, as in ``causal_conv3x3x3``.
    """
    b, t, hp, wp, c = x_padded.shape
    kt, o = kernel.shape[0], kernel.shape[-1]
    if native:
        phases = jnp.stack([_phase_kernel(kernel[i]) for i in range(kt)])  # (3, 3, 3, C, 4·O)
        y = _native_causal(past, x_padded, phases, start=start, rounded_sums=rounded_sums)
        y = _phase_channels_to_pixels(y.reshape(b * t, hp - 2, wp - 2, 4 * o))
        return (y + bias).astype(x_padded.dtype).reshape(b, t, 2 * (hp - 2), 2 * (wp - 2), o)
    seq = _sequence(past, x_padded, start)
    folded = kernel.transpose(1, 2, 0, 3, 4).reshape(3, 3, kt * c, o)

    def conv(block):
        bb, span, rp, _, _ = block.shape
        g = span - kt + 1
        stacked = jnp.concatenate([block[:, i : i + g] for i in range(kt)], axis=-1)
        y = _upsample_tap_matmul_conv(stacked.reshape(bb * g, rp, wp, kt * c), folded)
        return (y + bias).astype(x_padded.dtype).reshape(bb, g, 2 * (rp - 2), 2 * (wp - 2), o)

    return conv_blocks(conv, seq, window=kt, out_channels=o, scale=2,
                       bytes_per_frame_row=b * wp * (16 * o + (kt + 4) * c) * 4, block_bytes=block_bytes)


def downsample2x_causal_conv3x3x3(past: jax.Array | None, x_padded: jax.Array, kernel: jax.Array, bias: jax.Array,
                                  *, time_stride: int, start: str = "zero", block_bytes: int = CPU_BLOCK_BYTES,
                                  native: bool, rounded_sums: bool = False, onednn: bool = False) -> jax.Array:
    """Causal 3x3x3 conv with stride ``(time_stride, 2, 2)`` over frames padded by one row/column on
    every side (HunyuanVideo's downsampler): ``past (B, 2, H+2, W+2, C)`` or None (the clip's start),
    ``x_padded (B, T, H+2, W+2, C)`` (``H``, ``W`` even) → ``(B, T', H/2, W/2, O)``,
    ``T' = (T − 1) // time_stride + 1``.

    Output row ``i`` reads padded rows ``2i .. 2i+2``: the frame's last padded row is never read, so
    this is ``downsample2x_conv2d_frames`` (which pads after only) on the frames without it, with
    the time taps folded into channels on CPU.
    """
    b, t, hp, wp, _ = x_padded.shape
    kt, o = kernel.shape[0], kernel.shape[-1]
    frames = (t - 1) // time_stride + 1
    if runs_native(native=native, onednn=onednn, pixels=b * frames * ((hp - 2) // 2) * ((wp - 2) // 2), kernel=kernel):
        y = _native_causal(None if past is None else past[:, :, :-1, :-1], x_padded[:, :, :-1, :-1], kernel,
                           start=start, strides=(time_stride, 2, 2), rounded_sums=rounded_sums)
        return (y + bias).astype(x_padded.dtype)
    seq = _sequence(past, x_padded, start)[:, :, :-1, :-1]
    taps = [seq[:, i : i + time_stride * (frames - 1) + 1 : time_stride] for i in range(kt)]
    folded = kernel.transpose(1, 2, 0, 3, 4).reshape(3, 3, kt * kernel.shape[3], o)
    return downsample2x_conv2d_frames(jnp.concatenate(taps, axis=-1), folded, bias, block_bytes=block_bytes,
                                      native=False)


def next_cache(past: jax.Array, x: jax.Array, *, window_free: bool) -> jax.Array:
    """The last two frames of ``past ++ x``, built one of two ways (the same values).

    ``window_free`` (native convs with halo exchanges: TPU/GPU at tp > 1): from the past's last
    frames and the new ones. Sliced out of the conv's 3-frame window instead, the cache keeps that
    window alive, and libtpu's scheduler, overlapping the halo exchanges, then holds every
    full-resolution conv's window at once (Wan 2.1 at 1280x704x17, bfloat16, v6e, libtpu 0.0.50:
    window-free, tp=2 needs 1.80 GB of temp, 1.39 GB with the caches flattened: ``stored_cache``).
    Without exchanges the slice keeps the least, on the TPU (tp=1: 2.37 GB, against 4.19 GB
    window-free) and on the CPU alike."""
    if x.shape[1] >= CACHE_FRAMES:
        return x[:, -CACHE_FRAMES:]
    if window_free:
        return jnp.concatenate([past[:, x.shape[1]:], x], axis=1)
    return jnp.concatenate([past, x], axis=1)[:, -CACHE_FRAMES:]


def stored_cache(frames: jax.Array, *, flat: bool) -> jax.Array:
    """A conv's two past frames ``(B, 2, H+2, W+2, C)`` as steps carry them: with ``flat`` (native
    convs with halo exchanges: TPU/GPU at tp > 1) as ``(B, 2, H+2, (W+2)·C)``, else as they are.

    A TPU lays a buffer out in tiles of its two minor axes. Kept as frames, libtpu lays a band's
    caches out channels-minor, padding C to 128 lanes (96 → 128 in Wan's widest layers), and packs
    the padded buffers loosely: Wan 2.1 at 1280x704x17, bfloat16, on v6e (libtpu 0.0.50) needs 1.80
    GB of temp at tp = 2 that way, 1.39 GB flattened (tp = 4: 0.83, 0.58 GB). One chip keeps the
    frames: flattened its caches take 2.83 GB against 2.37. On a GPU the reshape is a bitcast."""
    return frames.reshape(*frames.shape[:3], -1) if flat else frames


def cache_frames(cache: jax.Array, like: jax.Array) -> jax.Array:
    """``stored_cache``'s frames again, shaped like the frames ``like (B, T, H+2, W+2, C)``."""
    return cache.reshape(*cache.shape[:3], *like.shape[3:])


def rms_norm(x: jax.Array, gamma: jax.Array) -> jax.Array:
    """``F.normalize(x, dim=channels) * sqrt(C) * gamma``, per pixel, computed in float32."""
    x32 = x.astype(jnp.float32)
    norm = jnp.sqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True))
    y = x32 / jnp.maximum(norm, _RMS_EPS) * math.sqrt(x.shape[-1])
    return (y * gamma.astype(jnp.float32)).astype(x.dtype)


def upsample_nearest_2x(x: jax.Array) -> jax.Array:
    """``(..., H, W, C)`` → ``(..., 2H, 2W, C)``; equals 'nearest-exact' for an integer factor."""
    *lead, h, w, c = x.shape
    x = jnp.broadcast_to(x[..., :, None, :, None, :], (*lead, h, 2, w, 2, c))
    return x.reshape(*lead, 2 * h, 2 * w, c)


def interleave_time(x: jax.Array) -> jax.Array:
    """Time conv output ``(B, T, H, W, 2C)`` → ``(B, 2T, H, W, C)``.

    Frame ``2t`` gets channels ``[0:C]`` and frame ``2t+1`` gets ``[C:2C]`` (the reference's
    ``reshape(b, 2, c, ...)`` + ``stack(dim=3)``).
    """
    b, t, h, w, c2 = x.shape
    x = x.reshape(b, t, h, w, 2, c2 // 2)
    return jnp.moveaxis(x, 4, 2).reshape(b, 2 * t, h, w, c2 // 2)


def initial_past(x: jax.Array, start: str) -> jax.Array:
    """The two frames before a clip ``x (B, T, ...)``: zeros (``start="zero"``: Wan's empty cache) or
    two copies of its first frame (``"replicate"``: a causal conv that pads time with
    ``mode="replicate"``, as HunyuanVideo's do)."""
    if start == "replicate":
        return jnp.broadcast_to(x[:, :1], (x.shape[0], CACHE_FRAMES, *x.shape[2:]))
    return jnp.zeros((x.shape[0], CACHE_FRAMES, *x.shape[2:]), x.dtype)


def past_or_zeros(cache: jax.Array | None, x: jax.Array) -> jax.Array:
    """The cached two past frames of ``x (B, T, ...)``, or zeros for latent frame 0."""
    return initial_past(x, "zero") if cache is None else cache


# -- encoder: stride-2 downsampling ---------------------------------------------------------------
# The encoder's 3x3 stride-2 conv reads input rows 2i, 2i+1, 2i+2 for output row i. Split into
# 2x2 phases (space-to-depth), it is a stride-1 conv with 2x2 taps over 4C channels: tap (a, b)
# of phase (p, q) is kernel row 2a+p, column 2b+q (zero where that is 3). On CPU that is one
# matmul and a shifted sum, like the nine-tap conv, and it blocks the same way (``conv_blocks``).
def _space_to_depth(x: jax.Array) -> jax.Array:
    """``(N, 2h, 2w, C)`` → ``(N, h, w, 4C)``, channels ordered (row phase, column phase, C)."""
    n, hh, ww, c = x.shape
    x = x.reshape(n, hh // 2, 2, ww // 2, 2, c)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(n, hh // 2, ww // 2, 4 * c)


def _downsample_phase_kernel(kernel: jax.Array) -> jax.Array:
    """A stride-2 kernel ``(3, 3, C, O)`` as the 2x2-tap kernel ``(2, 2, 4C, O)`` over space-to-depth input."""
    _, _, c, o = kernel.shape
    padded = jnp.pad(kernel, ((0, 1), (0, 1), (0, 0), (0, 0)))  # kernel rows/columns 3 are zero
    return padded.reshape(2, 2, 2, 2, c, o).transpose(0, 2, 1, 3, 4, 5).reshape(2, 2, 4 * c, o)


def downsample2x_conv2d_frames(x_padded: jax.Array, kernel: jax.Array, bias: jax.Array, *,
                               block_bytes: int = CPU_BLOCK_BYTES, native: bool,
                               rounded_sums: bool = False, onednn: bool = False) -> jax.Array:
    """3x3 stride-2 'valid' conv of every frame padded by one row/column at the bottom/right.

    ``(B, T, H+1, W+1, C)`` (``H``, ``W`` even) x ``(3, 3, C, O)`` → ``(B, T, H/2, W/2, O)``: the
    reference's ``ZeroPad2d((0, 1, 0, 1))`` + ``Conv2d(stride=2)``. Sums are float32 (unless
    ``rounded_sums``) until the bias is added. On CPU: space-to-depth, then a 2x2-tap matmul conv
    (16·C·O multiply-adds per output pixel against 9·C·O, for one matmul instead of four), in blocks
    under ``block_bytes``.
    """
    b, t, hp, wp, c = x_padded.shape
    h, w, o = (hp - 1) // 2, (wp - 1) // 2, kernel.shape[-1]
    if runs_native(native=native, onednn=onednn, pixels=b * t * h * w, kernel=kernel):
        y = lax.conv_general_dilated(x_padded.reshape(b * t, hp, wp, c), kernel, (2, 2), "VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     precision=matmul_precision(x_padded.dtype),
                                     preferred_element_type=sums_type(x_padded.dtype, rounded=rounded_sums))
        return (y + bias).astype(x_padded.dtype).reshape(b, t, h, w, o)
    # Three more zero rows/columns: (H+4, W+4) → (h+2, w+2) phase rows, the "padded" frame shape
    # ``conv_blocks`` expects (it takes 2 rows of overlap); the taps never read the last one.
    extra = jnp.pad(x_padded, ((0, 0), (0, 0), (0, 3), (0, 3), (0, 0)))
    phases = _space_to_depth(extra.reshape(b * t, hp + 3, wp + 3, c)).reshape(b, t, h + 2, w + 2, 4 * c)
    weights = _downsample_phase_kernel(kernel).transpose(2, 0, 1, 3).reshape(4 * c, 4 * o)

    def conv(block):
        bb, g, rp, cp, _ = block.shape
        taps = jnp.einsum("nhwc,co->nhwo", block.reshape(bb * g, rp, cp, 4 * c), weights,
                          precision=matmul_precision(block.dtype),
                          preferred_element_type=jnp.float32).reshape(bb * g, rp, cp, 2, 2, o)
        rows, cols = rp - 2, cp - 2
        y = sum(taps[:, a : a + rows, d : d + cols, a, d] for a in (0, 1) for d in (0, 1))
        return (y + bias).astype(x_padded.dtype).reshape(bb, g, rows, cols, o)

    return conv_blocks(conv, phases, window=1, out_channels=o,
                       bytes_per_frame_row=b * (w + 2) * (4 * o + 4 * c) * 4, block_bytes=block_bytes)


def time_downsample(past: jax.Array, x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
    """Stride-2 causal (3, 1, 1) conv over the last frame of the previous chunk and this chunk.

    ``past (B, 1, H, W, C)``, ``x (B, T, H, W, C)`` (T even), kernel ``(3, C, O)`` → ``(B, T/2, H, W, O)``:
    output frame ``t`` reads frames ``2t, 2t+1, 2t+2`` of ``past ++ x``.
    """
    seq = jnp.concatenate([past, x], axis=1)
    frames = (seq.shape[1] - 3) // 2 + 1
    y = sum(
        jnp.einsum("bthwc,co->bthwo", seq[:, i : i + 2 * frames - 1 : 2], kernel[i],
                   precision=matmul_precision(x.dtype), preferred_element_type=jnp.float32)
        for i in range(3)
    )
    return (y + bias).astype(x.dtype)
