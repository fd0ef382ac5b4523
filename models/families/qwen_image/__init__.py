"""Qwen-Image: ``AutoencoderKLQwenImage``, the Wan 2.1 architecture with weights of its own, for images."""

from vaeserve.models.descriptor import EmbeddedModel, FamilyDescriptor, ModuleTypes

from .config import QwenImageConfig

FAMILY = FamilyDescriptor(
    folder="qwen_image", title="Qwen-Image",
    configs=(QwenImageConfig,),
    modules={QwenImageConfig.class_name: ModuleTypes("modules:QwenImageDecoder", "modules:QwenImageEncoder",
                                                     check_encoder="modules:check_encoder_config")},
    embedded=(EmbeddedModel("qwen-image", "Qwen-Image", QwenImageConfig),),
)
