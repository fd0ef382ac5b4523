"""vaeserve's client: numpy calls of the HTTP API, and ``RemoteVAE``, a served VAE that diffusers
pipelines take as their own.

    from vaeserve_client import decode, encode, RemoteVAE     # installed as vaeserve-client
    from vaeserve.client import decode, encode, RemoteVAE     # the same code, inside vaeserve

The calls need httpx and numpy; ``RemoteVAE`` also torch and diffusers (imported when one is built),
so this package installs without JAX (``pip install vaeserve-client[pipelines]``).
"""

from .http import (
    DecodeError as DecodeError,
    decode as decode,
    decode_stream as decode_stream,
    encode as encode,
    read_stream as read_stream,
    served_models as served_models,
)
from .remote_vae import RemoteVAE as RemoteVAE

__all__ = ["DecodeError", "RemoteVAE", "decode", "decode_stream", "encode", "read_stream", "served_models"]
