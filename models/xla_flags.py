"""XLA flags that the ``vaeserve`` commands, the benches and the tests set before JAX starts a backend.

XLA reads ``XLA_FLAGS`` once, when a process first uses a backend, so this sets the environment
variable and imports nothing (callers run it before their first JAX computation).
"""

from __future__ import annotations

import os

# On CPU, XLA hands every matmul to YNNPACK by default. Its Eigen matmul is faster on the decoders'
# shapes: the same decodes take 5–16% less time (``python -m bench.decode --model M --skip-diffusers``
# with and without this flag, ours only, on a 2-core x86-64 host; docs/performance.md). The flag
# names no YNNPACK fusion, so every dot goes to Eigen. No effect on TPU or GPU programs.
CPU_DOTS_BY_EIGEN = "--xla_cpu_experimental_ynn_fusion_type="


def with_cpu_dots_by_eigen(xla_flags: str) -> str:
    """``xla_flags`` with ``CPU_DOTS_BY_EIGEN`` added, unless they already choose YNNPACK's fusions."""
    if CPU_DOTS_BY_EIGEN.rstrip("=") in xla_flags:
        return xla_flags
    return f"{xla_flags} {CPU_DOTS_BY_EIGEN}".strip()


def prefer_eigen_dots_on_cpu() -> None:
    """Set ``XLA_FLAGS`` so this process's CPU programs run their matmuls on Eigen (a user's own
    choice of YNNPACK fusions in ``XLA_FLAGS`` is kept)."""
    os.environ["XLA_FLAGS"] = with_cpu_dots_by_eigen(os.environ.get("XLA_FLAGS", ""))
