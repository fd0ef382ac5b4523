"""MiniMax-H3's video VAE (diffusers' ``AutoencoderKLMiniMaxH3``): a causal 3-D CNN encoder and a
ViT decoder, decoded as released in tiles and chunks (``decode``).

Its modules are not the frame-stepped ones the decode and encode loops of ``models.decode`` /
``models.encode`` call (``models.family_modules``): it builds its own programs (``programs``).
"""

from vaeserve.models.descriptor import EmbeddedModel, FamilyDescriptor, ModuleTypes

from .config import AutoencoderKLMiniMaxH3Config

FAMILY = FamilyDescriptor(
    folder="minimax_h3", title="MiniMax-H3",
    configs=(AutoencoderKLMiniMaxH3Config,),
    modules={AutoencoderKLMiniMaxH3Config.class_name: ModuleTypes("modules:H3Decoder", "modules:H3Encoder",
                                                                  programs="programs")},
    embedded=(EmbeddedModel("minimax-h3", "MiniMax-H3", AutoencoderKLMiniMaxH3Config, sound="minimax_h3_audio"),),
)
