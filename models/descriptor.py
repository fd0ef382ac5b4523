"""What a family's folder exports: its ``FamilyDescriptor`` (``models.registry`` lists them). No JAX here."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Callable
from functools import cache
from types import ModuleType
from typing import Any

from .conditions import Condition
from .config import VAEConfig

FAMILIES_PACKAGE = "vaeserve.models.families"


@dataclasses.dataclass(frozen=True)
class EmbeddedModel:
    """A model served by name with seeded random weights (``load_vae(name)``): the real architecture."""

    name: str
    title: str  # in words: logs, metadata, ``--help``
    config: Callable[[], VAEConfig]
    sound: str | None = None  # the folder of its sound family (``models.sound``), served beside it


@dataclasses.dataclass(frozen=True)
class ModuleTypes:
    """A config's decoder and encoder module types and its encoder's config check, as dotted paths
    relative to the family's package (``"decoder:WanDecoder"``); ``check_encoder`` raises
    ``ConfigError`` for a config whose decoder runs but whose encoder does not (None: every config's
    encoder runs). ``programs``: the module of a family whose modules are not the frame-stepped
    ones the generic decode and encode loops call (``models.family_modules``), which builds its own
    whole programs instead (``models.family_modules.FamilyPrograms``); None for the others."""

    decoder: str
    encoder: str
    check_encoder: str | None = None
    programs: str | None = None


@dataclasses.dataclass(frozen=True)
class FamilyDescriptor:
    """A family: ``folder`` under ``models/families/``, ``title`` in words, its config classes
    (each answers ``VAEConfig``), ``modules`` by config class name, the ``embedded`` models, and the
    decode ``conditions`` its decoders take (none for most)."""

    folder: str
    title: str
    configs: tuple[Any, ...]  # config classes, each answering VAEConfig
    modules: dict[str, ModuleTypes]
    embedded: tuple[EmbeddedModel, ...] = ()
    conditions: tuple[Condition, ...] = ()

    @property
    def package(self) -> str:
        return f"{FAMILIES_PACKAGE}.{self.folder}"

    def part(self, name: str) -> ModuleType | None:
        """The folder's ``name`` module (``estimate``, ``flops``, ``weights``), or None without one."""
        return _part(self.package, name)

    def load(self, dotted: str) -> Any:
        """``"module:attribute"`` within the family's package, imported now."""
        module, _, attribute = dotted.partition(":")
        return getattr(importlib.import_module(f"{self.package}.{module}"), attribute)


@cache
def _part(package: str, name: str) -> ModuleType | None:
    if importlib.util.find_spec(f"{package}.{name}") is None:
        return None
    return importlib.import_module(f"{package}.{name}")
