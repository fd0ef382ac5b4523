"""HTTP routes, one ``APIRouter`` per area (its OpenAPI tag set once): ``operations`` (probes,
metrics), ``models``, ``decode``, ``encode``, ``ui`` (the page)."""

from . import decode, encode, models, operations, ui

__all__ = ["decode", "encode", "models", "operations", "ui"]
