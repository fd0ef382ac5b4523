"""HunyuanVideo 1.5: ``AutoencoderKLHunyuanVideo15``, causal with a frame-causal mid-block attention."""

from vaeserve.models.descriptor import EmbeddedModel, FamilyDescriptor, ModuleTypes

from .config import HunyuanVideo15Config

FAMILY = FamilyDescriptor(
    folder="hunyuan15", title="HunyuanVideo 1.5",
    configs=(HunyuanVideo15Config,),
    modules={HunyuanVideo15Config.class_name: ModuleTypes("modules:HunyuanVideo15Decoder", "modules:HunyuanVideo15Encoder",
                                                          check_encoder="modules:check_encoder_config")},
    embedded=(EmbeddedModel("hunyuan1.5", "HunyuanVideo 1.5", HunyuanVideo15Config),),
)
