"""The Python client where the server's package has always offered it: ``vaeserve.client``
(also built alone, without JAX, as the ``vaeserve-client`` distribution: ``client/``)."""

from vaeserve.client import (
    DecodeError as DecodeError,
    RemoteVAE as RemoteVAE,
    decode as decode,
    decode_stream as decode_stream,
    encode as encode,
    read_stream as read_stream,
    served_models as served_models,
)

__all__ = ["DecodeError", "RemoteVAE", "decode", "decode_stream", "encode", "read_stream", "served_models"]
