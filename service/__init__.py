"""The vaeserve HTTP service: ``create_app`` and ``Settings``; ``vaeserve`` is ``service.cli:main``."""

from .app import create_app
from .settings import Settings

__all__ = ["Settings", "create_app"]
