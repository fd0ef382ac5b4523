"""The engine's start-up, as the HTTP layer starts it: in the device thread, JAX imported there.

Importing JAX and loading the model take seconds; the HTTP layer never imports JAX (a test keeps
it so), so that ``/healthz`` answers while they happen. This module is the one door between the
two: it imports the device side (``service.engine.startup``) when the device thread calls it.
"""

from __future__ import annotations

from typing import Any

from ..metrics import Metrics
from ..settings import Settings
from .model import ServedModels


def boot(settings: Settings, metrics: Metrics, **options: Any) -> ServedModels:
    """``service.engine.startup.startup(settings, metrics, **options)``, imported on the way."""
    from .startup import startup  # the device side: JAX, the models, the mesh

    return startup(settings, metrics, **options)
