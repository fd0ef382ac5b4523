"""HTTP routes, one ``APIRouter`` per area: ``operations`` (probes, metrics, models), ``decode``,
``encode``."""

from . import decode, encode, operations

__all__ = ["decode", "encode", "operations"]
