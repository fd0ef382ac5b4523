"""The model families, one descriptor each, and every list made from them. No JAX here.

A family is a folder, ``models/families/<folder>/``: its config classes (``config.py``), its
modules, and, by convention, the parts generic code asks it for — each optional, each a module of
the folder with a fixed interface:

* ``estimate``: ``family_estimate(config) -> models.estimate.FamilyEstimate`` (the memory estimate's
  layers and coefficients; without it, programs are checked once compiled only);
* ``flops``: ``decode_flops(config, t, h, w)`` and ``encode_flops(config, f, h, w)``, per row;
* ``weights``: ``release_config(names)`` and ``diffusers_config(names)`` (the config a checkpoint's
  tensor names belong to, or None) and ``to_diffusers_names(tensors, config)`` (None: already
  diffusers' names).

Its ``__init__.py`` exports one ``FamilyDescriptor``, ``FAMILY``: the config classes, the module
types by lazy dotted path (JAX is imported only when a model is built), the embedded models
(``vaeserve serve --model NAME``) and the decode conditions it takes (``models.conditions``). This
module lists the descriptors, in the order tensor names are matched to families; adding a family is
its folder plus one line here. Generic code never imports a family's modules: it asks this registry.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .conditions import conditions_taken
from .config import ConfigError, VAEConfig
from .descriptor import EmbeddedModel, FamilyDescriptor, ModuleTypes
from .sound import SoundFamily

__all__ = ["DEFAULT_MODEL", "EMBEDDED", "FAMILIES", "EmbeddedModel", "FamilyDescriptor", "ModuleTypes", "config_class", "config_from_dict", "read_config",
           "default_config", "default_family", "embedded_model", "embedded_names_text", "family_of",
           "known_class_name", "module_types", "SOUND_FAMILIES", "sound_family_of"]


def _families() -> tuple[FamilyDescriptor, ...]:
    from .families import hunyuan, hunyuan15, kl, ltx, minimax_h3, qwen_image, wan

    # The order tensor names are matched in (models.loading.config_for_names); Wan's diffusers names
    # are the default, so it comes first in every list.
    return (wan.FAMILY, hunyuan.FAMILY, hunyuan15.FAMILY, ltx.FAMILY, kl.FAMILY, qwen_image.FAMILY,
            minimax_h3.FAMILY)


def _sound_families() -> tuple[SoundFamily, ...]:
    from .families import ltx2_audio, minimax_h3_audio

    return (ltx2_audio.SOUND, minimax_h3_audio.SOUND)


FAMILIES: tuple[FamilyDescriptor, ...] = _families()
SOUND_FAMILIES: dict[str, SoundFamily] = {family.folder: family for family in _sound_families()}
_BY_CLASS: dict[str, tuple[FamilyDescriptor, type]] = {
    cls.class_name: (family, cls) for family in FAMILIES for cls in family.configs}
EMBEDDED: dict[str, EmbeddedModel] = {model.name: model for family in FAMILIES for model in family.embedded}
DEFAULT_MODEL = FAMILIES[0].embedded[0].name


def default_family() -> FamilyDescriptor:
    return FAMILIES[0]


def default_config() -> VAEConfig:
    """The default embedded model's config (Wan 2.1's real architecture)."""
    return EMBEDDED[DEFAULT_MODEL].config()


def config_class(class_name: str) -> Any:
    """The config class of a diffusers ``_class_name``; ``ConfigError`` naming the known ones."""
    if class_name not in _BY_CLASS:
        raise ConfigError(f"config _class_name is {class_name!r}; expected one of {sorted(_BY_CLASS)}")
    return _BY_CLASS[class_name][1]


def known_class_name(class_name: str) -> bool:
    return class_name in _BY_CLASS


def family_of(config: VAEConfig) -> FamilyDescriptor:
    """The family a config belongs to (by its class name)."""
    return _BY_CLASS[config.class_name][0]


def module_types(config: VAEConfig) -> ModuleTypes:
    return family_of(config).modules[config.class_name]


def embedded_model(name: str) -> EmbeddedModel:
    if name not in EMBEDDED:
        raise ValueError(f"no embedded model {name!r}; expected one of {list(EMBEDDED)}")
    return EMBEDDED[name]


def embedded_names_text() -> str:
    """The embedded model names, for help texts: ``wan2.1 (the default), wan2.2, …``."""
    return ", ".join(f"{name} (the default)" if name == DEFAULT_MODEL else name for name in EMBEDDED)


def sound_family_of(source: str | Path | None) -> SoundFamily | None:
    """The sound served beside the model ``source`` names (None: the default embedded model): an
    embedded model's own, or the sound family whose folders a pipeline folder holds (LTX-2's
    ``audio_vae/`` of an ``AutoencoderKLLTX2Audio`` and ``vocoder/``); None without one."""
    if source is None or (isinstance(source, str) and source in EMBEDDED):
        folder = EMBEDDED[source or DEFAULT_MODEL].sound
        return None if folder is None else SOUND_FAMILIES[folder]
    root = Path(source)
    if root.name == "vae":  # a pipeline's vae/ folder given: its sound lies beside it
        root = root.parent
    return next((family for family in SOUND_FAMILIES.values() if family.serves(root)), None)


def config_from_dict(raw: dict[str, Any]) -> VAEConfig:
    """The config of a diffusers ``config.json`` body, by its ``_class_name`` (the default family's
    when absent: ``models.registry``)."""
    class_name = raw.get("_class_name", default_family().configs[0].class_name)
    return config_class(class_name).from_dict(raw)


def read_config(path: str | Path) -> VAEConfig:
    """``config_from_dict`` of a ``config.json`` file."""
    with open(path, encoding="utf-8") as f:
        return config_from_dict(json.load(f))


def models_in_words() -> str:
    """Every embedded model's title, in the registry's order, as prose: what the README, the docs'
    index and the package's description say the service holds (``tests/models/test_registry_lists.py``)."""
    titles = [re.sub(r" \d+\.\d+\.\d+$", "", model.title) for model in EMBEDDED.values()]  # "LTX-Video 0.9.5" -> "LTX-Video"
    return ", ".join(titles[:-1]) + " and " + titles[-1]


def families_markdown() -> str:
    """The table of families docs/models.md shows (generated; a test holds the page to it): each
    embedded model with the decode conditions it takes (``models.conditions.conditions_taken``)."""
    rows = ["| family | diffusers classes | embedded models (`--model NAME`, random weights): decode conditions |",
            "| --- | --- | --- |"]
    for family in FAMILIES:
        classes = ", ".join(f"`{cls.class_name}`" for cls in family.configs)
        embedded = "; ".join(f"`{m.name}` ({m.title}): {', '.join(f'`{c}`' for c in conditions_taken(m.config())) or 'none'}"
                             for m in family.embedded)
        rows.append(f"| {family.title} (`models/families/{family.folder}/`) | {classes} | {embedded} |")
    return "\n".join(rows) + "\n"
