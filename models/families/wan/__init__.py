"""Wan 2.1 and Wan 2.2 (TI2V-5B): ``AutoencoderKLWan``, causal 3-D VAEs that decode step by step.
Wan 2.2's A14B models use the Wan 2.1 VAE."""

from vaeserve.models.descriptor import EmbeddedModel, FamilyDescriptor, ModuleTypes

from .config import WanVAEConfig

FAMILY = FamilyDescriptor(
    folder="wan", title="Wan 2.1 and 2.2",
    configs=(WanVAEConfig,),
    modules={WanVAEConfig.class_name: ModuleTypes("decoder:WanDecoder", "encoder:WanEncoder",
                                                  check_encoder="encoder:check_encoder_config")},
    embedded=(EmbeddedModel("wan2.1", "Wan 2.1", WanVAEConfig), EmbeddedModel("wan2.2", "Wan 2.2", WanVAEConfig.wan22)),
)
