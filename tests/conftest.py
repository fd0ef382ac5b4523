"""Test-wide set-up. Runs before any test module imports JAX."""

import os

# Eight fake CPU devices so sharded decodes run on this machine; must precede JAX's backend init.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The longest test files (minutes each on 2 cores) run first: `make test` hands whole files to its
# worker processes in collection order, and a long file handed out last would run alone at the end.
LONGEST_FIRST = (
    "tests/sharding/test_tpu_aot.py",
    "tests/multihost/test_slice_parity.py",
    "tests/models/test_parity_wan22.py",
    "tests/multihost/test_slice_service.py",
    "tests/service/http/test_serving_wan22.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))  # stable
