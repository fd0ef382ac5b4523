"""LTX-Video (0.9.0 – 0.9.8) and LTX-2: ``AutoencoderKLLTXVideo``, ``AutoencoderKLLTX2Video``.
Decoders that see ahead (their frames come ``lookahead`` latent frames behind their input); those
from LTX-Video 0.9.1 on take a decode timestep and inject noise (``models.conditions``)."""

from vaeserve.models.conditions import NOISE_SCALE, SEED, TIMESTEP
from vaeserve.models.descriptor import EmbeddedModel, FamilyDescriptor, ModuleTypes

from .config import LTX2VideoConfig, LTXVideoConfig

_MODULES = ModuleTypes("modules:LTXDecoder", "modules:LTXEncoder", check_encoder="modules:check_encoder_config")

FAMILY = FamilyDescriptor(
    folder="ltx", title="LTX-Video and LTX-2",
    configs=(LTXVideoConfig, LTX2VideoConfig),
    modules={LTXVideoConfig.class_name: _MODULES, LTX2VideoConfig.class_name: _MODULES},
    embedded=(EmbeddedModel("ltx-video", "LTX-Video 0.9.5", LTXVideoConfig.v095),
              EmbeddedModel("ltx2", "LTX-2", LTX2VideoConfig.ltx2, sound="ltx2_audio")),
    conditions=(TIMESTEP, NOISE_SCALE, SEED),
)
