"""The AutoencoderKL family's (SD, SDXL, Flux.1; Flux.2) layers as the memory estimate sees them
(``models.estimate``), and their fitted coefficients."""

from __future__ import annotations

from vaeserve.models.estimate import AttentionLayer, ConvLayer, FamilyEstimate, Grid, Layer, Table, coefficients

from .config import AutoencoderKLConfig, AutoencoderKLFlux2Config


def kl_decoder(config: AutoencoderKLConfig | AutoencoderKLFlux2Config, grid: Grid, *, first: bool,
               itemsize: int) -> list[Layer]:
    """The layers of an ``AutoencoderKL``'s whole-image decode (``models.families.kl.modules``): 2-D convs, no caches,
    the mid block's attention over every token of the image."""
    del first, itemsize
    dims = tuple(reversed(config.decoder_channels))
    frames, scale = grid.frames, 1

    def conv(cin: int, cout: int) -> ConvLayer:
        return ConvLayer(frames, scale, cin, cout, cache=None)

    layers: list[Layer] = [conv(config.latent_channels, dims[0]), conv(dims[0], dims[0]), conv(dims[0], dims[0])]
    if config.mid_block_add_attention:
        layers.append(AttentionLayer(frames * grid.rows * grid.cols, frames * grid.full_rows * grid.cols, dims[0]))
    layers += [conv(dims[0], dims[0]), conv(dims[0], dims[0])]
    for i, (cin, cout) in enumerate(zip((dims[0], *dims[:-1]), dims, strict=True)):
        for _ in range(config.layers_per_block + 1):
            layers += [conv(cin, cout), conv(cout, cout)]
            cin = cout
        if i < len(dims) - 1:  # nearest 2x then a 3x3 conv, computed from the low-resolution input
            layers.append(conv(cout, 4 * cout))
            scale *= 2
    layers.append(conv(dims[-1], config.out_channels))
    return layers


def kl_encoder(config: AutoencoderKLConfig | AutoencoderKLFlux2Config, grid: Grid, *, first: bool,
               itemsize: int) -> list[Layer]:
    """The layers of an ``AutoencoderKL``'s whole-image encode."""
    del first, itemsize
    dims = config.block_out_channels
    frames, scale = grid.frames, float(2 ** (len(dims) - 1))

    def conv(cin: int, cout: int) -> ConvLayer:
        return ConvLayer(frames, scale, cin, cout, cache=None)

    layers: list[Layer] = [conv(config.in_channels, dims[0])]
    for i, (cin, cout) in enumerate(zip((dims[0], *dims[:-1]), dims, strict=True)):
        for _ in range(config.layers_per_block):
            layers += [conv(cin, cout), conv(cout, cout)]
            cin = cout
        if i < len(dims) - 1:  # a stride-2 conv, seen at its output
            scale /= 2
            layers.append(conv(4 * cout, cout))
    layers += [conv(dims[-1], dims[-1])] * 2
    if config.mid_block_add_attention:
        layers.append(AttentionLayer(frames * grid.rows * grid.cols, frames * grid.full_rows * grid.cols, dims[-1]))
    layers += [conv(dims[-1], dims[-1])] * 2 + [conv(dims[-1], 2 * config.latent_channels)]
    return layers


def flux2_unused(config: AutoencoderKLFlux2Config) -> int:
    """Flux.2's ``bn`` statistics: kept with the weights, not used by the decode (not compiled in)."""
    return 2 * config.batch_norm_channels


# AutoencoderKL's and Flux.2's nine-tap coefficients, fitted over both (the same layers).
KL_MATMUL: Table = {"decode": coefficients(0.0, 0.0, 1.018, 0.389, 0.0, 0.157), "encode": coefficients(0.0, 0.0, 0.0, 2.537, 0.588, 0.0)}
# Images: tiny configs from 8x8 to 96x96 latents (768x768 frames). XLA:CPU's memory_analysis()
# of the AutoencoderKL decode holds the mid block's scores only up to one block of queries
# (4096 tokens), and the CPU convs' block budget bends the curves: 0.66-1.35.
AUTOENCODER_KL = FamilyEstimate(kl_decoder, kl_encoder, matmul=KL_MATMUL,
    onednn={"decode": coefficients(0.0, 0.0, 0.0, 0.309, 1.659, 1.149),
    "encode": coefficients(0.0, 0.0, 0.0, 0.275, 1.138, 0.0)})
FLUX2 = FamilyEstimate(kl_decoder, kl_encoder, matmul=KL_MATMUL,
    onednn={"decode": coefficients(0.0, 0.0, 0.0, 0.275, 1.706, 0.468), "encode": coefficients(0.0, 0.0, 0.0, 0.285, 1.137, 0.0)},
    first_step_unused=flux2_unused)


def family_estimate(config: AutoencoderKLConfig | AutoencoderKLFlux2Config) -> FamilyEstimate:
    return FLUX2 if isinstance(config, AutoencoderKLFlux2Config) else AUTOENCODER_KL
