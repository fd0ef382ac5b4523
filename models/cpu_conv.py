"""The CPU's 3x3 convolutions as matmuls, channels-last: pure functions of padded frames.

XLA:CPU's convolution is slow on these shapes while its matmul is fast, and memory traffic, not
arithmetic, is what a 2-core host runs short of. Two ways, chosen from the size of the conv
(``cpu_method``):

* ``"patches"``: the 9 shifted copies of the input (27 with three time taps) side by side, one
  matmul with the kernel exactly as stored. Nothing is done to the weights, so it wins where the
  weights outweigh the activations (a latent frame of 1024 channels: 113 MB of kernel, 64 pixels).
* ``"winograd"``: F(2x2, 3x3) (Lavin & Gray, 2015): each 2x2 block of outputs is
  ``Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`` of its 4x4 input patch ``d``: 16 products of a (C, O) matrix per
  4 outputs instead of 36. The transforms' coefficients are 0, ±1 and ±1/2, exact in binary: only
  the order of the float32 sums changes (errors about 1.5x the direct sum's against float64).
  It pays once there are enough pixels to amortize the weights' transform.

Nearest-2x upsampling followed by a 3x3 conv (``UPSAMPLED``) is the same construction over the
low-resolution input: an upsampled 4x4 patch repeats its middle rows, so one of its four
transformed rows is zero, leaving 9 products per 2x2 block of outputs (the direct conv of the
upsampled frame takes 36, its split into four 2x2 phase convs 16). The three time taps of a causal
3x3x3 conv are folded into channels before either (``(kt, C)`` channel order).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .spatial import matmul_precision

CpuMethod = Literal["patches", "winograd"]
# Output pixels (all frames of one conv call) from which Winograd beats patches: below it the
# weights' transform (read the kernel, write and read 16/9 of it) costs more than the products it
# saves. Measured on 2 cores: 1024 channels at 8x8 x 1 frame: patches 0.5x PyTorch's time,
# Winograd 2x; at 16x16 x 2 frames both 1.0x; 512 channels at 32x32 x 3 frames Winograd 0.75x.
WINOGRAD_MIN_PIXELS = 1024


class FastConv(NamedTuple):
    """A 1-D fast convolution: each ``window`` of the padded input (windows ``stride`` apart) becomes
    ``len(inputs)`` values (rows of ``inputs``), the three kernel taps as many weights (rows of
    ``kernel``), and their products ``len(outputs)`` outputs (rows of ``outputs``). Applied along
    rows and columns, it is the 2-D algorithm."""

    window: int
    stride: int
    inputs: tuple[tuple[float, ...], ...]
    kernel: tuple[tuple[float, ...], ...]
    outputs: tuple[tuple[float, ...], ...]


# F(2, 3): outputs (y0, y1) from inputs (d0..d3): 4 products (Bᵀ, G, Aᵀ of Lavin & Gray).
WINOGRAD = FastConv(4, 2, ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
                    ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1)),
                    ((1, 1, 1, 0), (0, 1, -1, -1)))
# The same after nearest-2x upsampling, from low-resolution rows (L0, L1, L2) around a pixel: the
# upsampled patch is (L0, L1, L1, L2), Bᵀ of it is (L0 − L1, 2·L1, 0, L1 − L2); the 2 moves into
# the kernel (2·G's second row: g0 + g1 + g2, no halving) and the zero row drops out: 3 products.
UPSAMPLED = FastConv(3, 1, ((1, -1, 0), (0, 1, 0), (0, 1, -1)),
                     ((1, 0, 0), (1, 1, 1), (0, 0, 1)),
                     ((1, 1, 0), (0, 1, -1)))


def cpu_method(pixels: int) -> CpuMethod:
    """How a stride-1 3x3 conv with ``pixels`` output pixels runs on CPU (see ``WINOGRAD_MIN_PIXELS``)."""
    return "winograd" if pixels >= WINOGRAD_MIN_PIXELS else "patches"


def patches_conv(taps: list[jax.Array], kernel: jax.Array) -> jax.Array:
    """Direct 3x3 conv summed over time taps, as one matmul: ``taps`` are ``kt`` padded inputs
    ``(N, H+2, W+2, C)``, ``kernel`` is ``(kt, 3, 3, C, O)`` (or ``(3, 3, C, O)`` for one tap), used
    as stored. → float32 ``(N, H, W, O)``."""
    _, hp, wp, _ = taps[0].shape
    h, w = hp - 2, wp - 2
    columns = jnp.concatenate([tap[:, dy : dy + h, dx : dx + w] for tap in taps for dy in range(3) for dx in range(3)],
                              axis=-1)
    weights = kernel.reshape(-1, kernel.shape[-1])  # (kt·3·3·C, O): the patches' channel order
    return jnp.einsum("nhwc,co->nhwo", columns, weights, precision=matmul_precision(columns.dtype),
                      preferred_element_type=jnp.float32)


def _outer(matrix: np.ndarray, i: int, j: int) -> np.ndarray:
    """``(P, P)`` coefficients of the 2-D transform (``matrix`` along rows and columns) on tap ``(i, j)``."""
    return np.outer(matrix[:, i], matrix[:, j]).astype(np.float32)


def fast_kernel(kernel: jax.Array, algorithm: FastConv) -> jax.Array:
    """The transformed kernel ``(P·P, C, O)`` float32 of a 3x3 kernel ``(3, 3, C, O)``: ``G g Gᵀ``,
    its first axis ordered (row product, column product). One fused pass over the kernel."""
    g = np.asarray(algorithm.kernel)
    p = len(g)
    terms = [jnp.asarray(_outer(g, r, s).reshape(p * p, 1, 1)) * kernel[r, s].astype(jnp.float32)
             for r in range(3) for s in range(3)]
    return sum(terms[1:], terms[0])


def fast_conv(x_padded: jax.Array, weights: jax.Array, algorithm: FastConv) -> jax.Array:
    """A 3x3 conv of padded frames by a fast algorithm: ``x_padded (N, Hp, Wp, C)`` with
    ``(Hp − window)`` and ``(Wp − window)`` multiples of the stride, ``weights`` from
    ``fast_kernel`` → float32 ``(N, A·th, A·tw, O)``, ``th = (Hp − window) / stride + 1`` tiles of
    ``A = len(outputs)`` rows (for ``WINOGRAD``: ``(N, Hp − 2, Wp − 2, O)``; ``UPSAMPLED``:
    ``(N, 2(Hp − 2), 2(Wp − 2), O)``).

    Input and output transforms are each one fused elementwise pass (a sum of shifted slices times
    constant coefficient arrays); between them, one batched matmul of ``P·P`` products."""
    n, hp, wp, _ = x_padded.shape
    tiles_h = (hp - algorithm.window) // algorithm.stride + 1
    tiles_w = (wp - algorithm.window) // algorithm.stride + 1
    transformed = _transform_input(x_padded.astype(jnp.float32), algorithm, tiles_h, tiles_w)
    products = jnp.einsum("kmc,kco->kmo", transformed, weights, precision=matmul_precision(jnp.float32))
    return _transform_output(products.reshape(-1, n, tiles_h, tiles_w, weights.shape[-1]), algorithm)


def _transform_input(x: jax.Array, algorithm: FastConv, tiles_h: int, tiles_w: int) -> jax.Array:
    """``Bᵀ d B`` of every window: ``(N, Hp, Wp, C)`` → ``(P·P, N·th·tw, C)``. Written as a sum of
    strided slices times ``(P·P, 1, 1, 1, 1)`` coefficients (most of them 0 or ±1) so that XLA
    makes it one loop fusion: a stack of P·P expressions would be P·P passes and a concatenation."""
    b = np.asarray(algorithm.inputs)
    p, s = len(b), algorithm.stride
    total = None
    for r in range(algorithm.window):
        for c in range(algorithm.window):
            coefficients = _outer(b, r, c)
            if not coefficients.any():
                continue
            window = x[:, r : r + s * (tiles_h - 1) + 1 : s, c : c + s * (tiles_w - 1) + 1 : s]
            term = jnp.asarray(coefficients.reshape(p * p, 1, 1, 1, 1)) * window[None]
            total = term if total is None else total + term
    assert total is not None
    return total.reshape(p * p, -1, x.shape[-1])


def _transform_output(products: jax.Array, algorithm: FastConv) -> jax.Array:
    """``Aᵀ m A`` of every tile: ``(P·P, N, th, tw, O)`` → ``(N, A·th, A·tw, O)``, the A x A outputs
    of tile ``(i, j)`` at rows ``A·i ..``, columns ``A·j ..``. One fused pass, as ``_transform_input``."""
    a = np.asarray(algorithm.outputs)
    rows, p = a.shape
    _, n, tiles_h, tiles_w, o = products.shape
    total = None
    for i in range(p):
        for j in range(p):
            coefficients = _outer(a, i, j)
            if not coefficients.any():
                continue
            term = jnp.asarray(coefficients.reshape(1, 1, rows, 1, rows, 1)) * products[i * p + j][:, :, None, :, None]
            total = term if total is None else total + term
    assert total is not None
    return total.reshape(n, rows * tiles_h, rows * tiles_w, o)
