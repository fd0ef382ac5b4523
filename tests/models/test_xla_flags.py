"""The CPU matmuls the `vaeserve` commands choose (``models.xla_flags``): Eigen's, not YNNPACK's.

Checked on the compiled program: a CPU dot compiled by XLA's default becomes a ``ynn_fusion``; with
the flag, plain dots. Real processes for the commands' side (XLA reads ``XLA_FLAGS`` once per
process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from models.xla_flags import CPU_DOTS_BY_EIGEN, with_cpu_dots_by_eigen

REPO = Path(__file__).resolve().parents[2]
# Prints whether a compiled CPU matmul went to YNNPACK.
DOT_PROGRAM = ("import jax, jax.numpy as jnp; "
               "print('ynn_fusion' in jax.jit(lambda a, b: a @ b).lower(jnp.ones((64, 128)), jnp.ones((128, 64)))"
               ".compile().as_text())")


def _python(code: str, xla_flags: str) -> str:
    env = {**os.environ, "XLA_FLAGS": xla_flags, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_flag_is_added_once_and_a_users_choice_is_kept():
    assert with_cpu_dots_by_eigen("") == CPU_DOTS_BY_EIGEN
    assert with_cpu_dots_by_eigen("--xla_force_host_platform_device_count=8") == (
        f"--xla_force_host_platform_device_count=8 {CPU_DOTS_BY_EIGEN}")
    assert with_cpu_dots_by_eigen(with_cpu_dots_by_eigen("")) == CPU_DOTS_BY_EIGEN
    mine = "--xla_cpu_experimental_ynn_fusion_type=individual_dot"
    assert with_cpu_dots_by_eigen(mine) == mine


def test_this_suite_compiles_cpu_dots_without_ynnpack():
    compiled = jax.jit(lambda a, b: a @ b).lower(jnp.ones((64, 128)), jnp.ones((128, 64))).compile()
    assert "ynn_fusion" not in compiled.as_text()


def test_xla_default_sends_cpu_dots_to_ynnpack():
    """The negative control: without the flag the same dot compiles to a YNNPACK fusion."""
    assert _python(DOT_PROGRAM, "") == "True"


def test_the_vaeserve_commands_set_the_flag_before_jax_starts():
    code = "from service.cli import main; main(['settings']); " + DOT_PROGRAM
    assert _python(code, "") == "False"
