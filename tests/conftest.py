"""Test-wide set-up. Runs before any test module imports JAX."""

import os

# Eight fake CPU devices so sharded decodes run on this machine; must precede JAX's backend init.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
