"""HTTP routes, one ``APIRouter`` per area: ``operations`` (probes, metrics, models), ``decode``."""

from . import decode, operations

__all__ = ["decode", "operations"]
