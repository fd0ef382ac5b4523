"""HunyuanVideo 1.0: ``AutoencoderKLHunyuanVideo``, whose GroupNorms span the whole clip (it decodes
a clip at once)."""

from vaeserve.models.descriptor import EmbeddedModel, FamilyDescriptor, ModuleTypes

from .config import HunyuanVideoConfig

FAMILY = FamilyDescriptor(
    folder="hunyuan", title="HunyuanVideo",
    configs=(HunyuanVideoConfig,),
    modules={HunyuanVideoConfig.class_name: ModuleTypes("modules:HunyuanVideoDecoder", "modules:HunyuanVideoEncoder")},
    embedded=(EmbeddedModel("hunyuan1.0", "HunyuanVideo", HunyuanVideoConfig),),
)
