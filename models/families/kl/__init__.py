"""The AutoencoderKL image VAEs: ``AutoencoderKL`` (Stable Diffusion 1.x/2.x, SDXL, Flux.1) and
``AutoencoderKLFlux2`` (Flux.2)."""

from vaeserve.models.descriptor import EmbeddedModel, FamilyDescriptor, ModuleTypes

from .config import AutoencoderKLConfig, AutoencoderKLFlux2Config

FAMILY = FamilyDescriptor(
    folder="kl", title="AutoencoderKL (SD, SDXL, Flux.1) and Flux.2",
    configs=(AutoencoderKLConfig, AutoencoderKLFlux2Config),
    modules={AutoencoderKLConfig.class_name: ModuleTypes("modules:KLDecoder", "modules:KLEncoder"),
             AutoencoderKLFlux2Config.class_name: ModuleTypes("modules:Flux2Decoder", "modules:KLEncoder")},
    embedded=(EmbeddedModel("sd", "Stable Diffusion 1.x/2.x", AutoencoderKLConfig.sd),
              EmbeddedModel("sdxl", "SDXL", AutoencoderKLConfig.sdxl),
              EmbeddedModel("flux1", "Flux.1", AutoencoderKLConfig.flux1),
              EmbeddedModel("flux2", "Flux.2", AutoencoderKLFlux2Config)),
)
