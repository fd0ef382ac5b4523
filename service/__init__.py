"""The vaeserve service, in subpackages named for their jobs:

* ``http``: the FastAPI app, routes, admission, problem documents, the uvicorn server;
* ``engine``: the device thread, its queue, the runner, start-up (the engine knows no HTTP);
* ``slice``: a multi-host slice (join, broadcast every device call, liveness, stop);
* ``codecs``: bytes ↔ arrays (latent and frame tensors, images, MP4, the frame stream);
* ``cli``: the ``vaeserve`` commands; ``client``: a Python client of the HTTP API.

``settings`` (every knob, declared once), ``metrics`` and ``problem`` are shared by all of them.
``create_app`` and ``Settings`` are the embedding API.
"""

if __name__ != "vaeserve.service":  # the checkout's folder imported by its own name would load every module twice
    raise ImportError(f"this is the package vaeserve.service: import it as `vaeserve.service`, not `{__name__}`")

from .http.app import create_app
from .settings import Settings

__all__ = ["Settings", "create_app"]
