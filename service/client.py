"""The Python client where the server's package has always offered it: ``vaeserve.client``
(also built alone, without JAX, as the ``vaeserve-client`` distribution: ``client/``)."""

from vaeserve.client import *  # noqa: F403  (every name of vaeserve.client, and only those)
from vaeserve.client import __all__ as __all__
