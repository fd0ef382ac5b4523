"""vaeserve: seam-free, distributed VAE decoding and encoding for video and image diffusion.

The Python API, one import (``import vaeserve``)::

    vae = vaeserve.load_vae("wan2.1")                      # embedded, a diffusers/pipeline folder, a .pth
    frames = vae.decode(latents)                           # (B, C, T, H, W) -> (B, 3, F, 8H, 8W)
    mesh = vaeserve.make_mesh(tp=2)
    banded = vaeserve.sharded_decode(vae, latents, mesh)   # == vae.decode(latents)
    app = vaeserve.create_app(vaeserve.Settings(model="wan2.1"))

Its subpackages: ``vaeserve.models`` (the VAEs), ``vaeserve.sharding`` (meshes, banded
programs, planning), ``vaeserve.service`` (the server, its engine and the command line) and
``vaeserve.client`` (the HTTP client and ``RemoteVAE``, a folder here, which ``client/`` also
builds alone as the ``vaeserve-client`` distribution, without JAX). In a checkout the first three
are the top-level folders ``models/``, ``sharding/`` and ``service/``, linked here; the wheel
installs them inside ``vaeserve/`` and nothing else at the top level.

Importing ``vaeserve`` does not import JAX: the names below load their module on first use (PEP 562),
so the HTTP layer (``vaeserve.service.http``) starts without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it; each name is declared once, here and in the block below.
_API = {
    "VAE": "vaeserve.models",
    "load_vae": "vaeserve.models",
    "load_config": "vaeserve.models",
    "init_vae": "vaeserve.models",
    "abstract_vae": "vaeserve.models",
    "save_vae": "vaeserve.models",
    "convert_checkpoint": "vaeserve.models",
    "make_mesh": "vaeserve.sharding",
    "sharded_decode": "vaeserve.sharding",
    "sharded_decode_stream": "vaeserve.sharding",
    "sharded_encode": "vaeserve.sharding",
    "plan_decode": "vaeserve.sharding",
    "create_app": "vaeserve.service",
    "Settings": "vaeserve.service",
}
_SUBPACKAGES = ("client", "models", "sharding", "service")

if TYPE_CHECKING:
    from vaeserve import client as client, models as models, service as service, sharding as sharding
    from vaeserve.models import (
        VAE as VAE,
        abstract_vae as abstract_vae,
        convert_checkpoint as convert_checkpoint,
        init_vae as init_vae,
        load_config as load_config,
        load_vae as load_vae,
        save_vae as save_vae,
    )
    from vaeserve.service import Settings as Settings, create_app as create_app
    from vaeserve.sharding import (
        make_mesh as make_mesh,
        plan_decode as plan_decode,
        sharded_decode as sharded_decode,
        sharded_decode_stream as sharded_decode_stream,
        sharded_encode as sharded_encode,
    )

__all__ = sorted([*_API, *_SUBPACKAGES])


def __getattr__(name: str) -> Any:
    if name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
