"""LTX-Video's and LTX-2's layers as the memory estimate sees them (``models.estimate``), and
their fitted coefficients."""

from __future__ import annotations

from vaeserve.models.estimate import ConvLayer, FamilyEstimate, Grid, KeptFrames, Layer, coefficients

from .config import LTX2VideoConfig, LTXVideoConfig

LTXConfig = LTXVideoConfig | LTX2VideoConfig



def ltx_decoder(config: LTXConfig, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of one decode step of an LTX decoder (``models.families.ltx.modules``): the first step's
    ``1 + lookahead`` latent frames, or a later step's one. Every 3x3x3 conv keeps its last two
    padded input frames; in a decoder that sees ahead, each conv of a first step emits one frame
    fewer than it takes, and each resnet (each residual upsampler) keeps the two (one) input frames
    its convs still owe (``Kept``)."""
    del itemsize
    plan = config.decoder_plan()
    ahead = not plan.causal
    frames, scale = (1 + config.lookahead) if first else 1, 1
    layers: list[Layer] = []

    def conv(cin: int, cout: int) -> None:
        nonlocal frames
        layers.append(ConvLayer(frames, scale, cin, cout))
        frames -= 1 if first and ahead else 0

    def resnet(cin: int, cout: int) -> None:
        conv(cin, cout)
        conv(cout, cout)
        if ahead:
            layers.append(KeptFrames(2, scale, cin))

    conv(plan.latent_channels, plan.mid_channels)
    for _ in range(plan.mid_layers):
        resnet(plan.mid_channels, plan.mid_channels)
    for block in plan.up_blocks:
        if block.cin != block.cout:
            resnet(block.cin, block.cout)
        if block.stride is not None:
            time, space = block.stride
            cin = block.cout * block.factor
            conv(cin, cin * time * space ** 2 // block.factor)
            if block.residual and ahead:
                layers.append(KeptFrames(1, scale, cin))
            frames = time * frames - (time - 1 if first else 0)
            scale *= space
        for _ in range(block.layers):
            resnet(block.cout, block.cout)
    conv(plan.head_channels, 3 * plan.patch ** 2)
    return layers


def ltx_encoder(config: LTXConfig, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of one encode step of an LTX encoder (causal): frame 0, or ``temporal_scale`` frames."""
    del grid, itemsize
    plan = config.encoder_plan()
    frames = 1 if first else config.temporal_scale
    scale: float = config.spatial_scale / plan.patch  # rows of the patchified input per latent row

    def resnet(cin: int, cout: int) -> list[Layer]:
        return [ConvLayer(frames, scale, cin, cout), ConvLayer(frames, scale, cout, cout)]

    layers: list[Layer] = [ConvLayer(frames, scale, 3 * plan.patch ** 2, plan.conv_in_channels)]
    for block in plan.down_blocks:
        for _ in range(block.layers):
            layers += resnet(block.cin, block.cin)
        if block.kind == "conv":  # a strided conv (it keeps one frame), then a resnet to cout
            scale /= 2
            layers.append(ConvLayer(frames, scale, 8 * block.cin, block.cin, cache="plain"))
            frames = frames if first else max(1, frames // 2)
            if block.cin != block.cout:
                layers += resnet(block.cin, block.cout)
        elif block.kind is not None and block.stride is not None:
            time, space = block.stride
            layers.append(ConvLayer(frames, scale, block.cin, block.cout // (time * space ** 2)))
            scale /= space
            frames = frames if first else max(1, frames // time)
        elif block.cin != block.cout:
            layers += resnet(block.cin, block.cout)
    for _ in range(plan.mid_layers):
        layers += resnet(plan.mid_channels, plan.mid_channels)
    layers.append(ConvLayer(frames, scale, plan.mid_channels, plan.latent_channels + 1))
    return layers


def first_step_frames(config: LTXConfig, latent_frames: int) -> int:
    return config.first_step_frames(latent_frames)


LTX_VIDEO = FamilyEstimate(ltx_decoder, ltx_encoder,
    matmul={"decode": coefficients(3.164, 0.0, 0.0, 1.238, 1.0, 0.0), "encode": coefficients(0.0, 6.434, 0.0, 1.801, 1.0, 0.0)},
    onednn={"decode": coefficients(0.376, 2.105, 0.0, 0.0, 1.0, 0.0), "encode": coefficients(0.0, 2.653, 0.0, 0.0, 1.0, 0.0)},
    first_step_frames=first_step_frames)
LTX2 = FamilyEstimate(ltx_decoder, ltx_encoder,
    matmul={"decode": coefficients(0.357, 3.693, 2.057, 0.0, 1.0, 0.528), "encode": coefficients(0.0, 0.0, 0.0, 3.212, 1.0, 0.0)},
    onednn={"decode": coefficients(0.0, 1.748, 0.0, 0.0, 1.0, 0.111), "encode": coefficients(0.0, 2.117, 0.0, 0.0, 1.0, 0.0)},
    first_step_frames=first_step_frames)


def family_estimate(config: LTXConfig) -> FamilyEstimate:
    return LTX2 if isinstance(config, LTX2VideoConfig) else LTX_VIDEO
