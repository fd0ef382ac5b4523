"""HTTP routes, one ``APIRouter`` per area: ``operations`` (probes, metrics, models), ``decode``,
``encode``, ``ui`` (the page)."""

from . import decode, encode, operations, ui

__all__ = ["decode", "encode", "operations", "ui"]
