"""What a program will need, per device, before it is compiled: an estimate from the shape rules.

``memory_analysis()`` of a compiled program is the figure a server checks before it runs anything
(``sharding.fits``); compiling a 1280x1280x129 program on a CPU host takes minutes and memory of
its own, so a server refuses the hopeless sizes first, from this estimate. Pure Python, no JAX:
the HTTP layer asks it before it reads a request's body.

A program's bytes per device are split as ``memory_analysis()`` splits them:

* arguments and outputs, counted exactly from the shapes: the weights (less those a program does
  not use: the time convs a first frame skips, Flux.2's BatchNorm statistics), the input (latents
  replicated over ``tp``, an LTX decoder's timestep and noise, or a band of frames), the output
  frames of the band, and for a stream step its caches (an argument and an output, the one donated
  to the other: each conv's last frames, and in an LTX decoder that sees ahead the frames its
  residuals still owe);
* temp, the working memory, from the network's layers (a per-family description, walked here
  from the config as ``models.flops`` walks it for FLOPs): the caches, the largest activation,
  on CPU the largest block of nine-tap matmul outputs (``models.conv``: capped by its block
  budget), and the attention's scores and gathered keys/values (over every latent token of an
  image in an ``AutoencoderKL``'s mid block: quadratic in its pixels); each weighted by a
  coefficient per family (``Coefficients``), calibrated against ``memory_analysis()``
  (``bench/memory.py --fit`` fits them, ``--compare`` prints the comparison;
  ``tests/models/test_memory_estimate.py`` holds it to bounds).

The programs are those a server compiles (``Estimator.decode_steps``): a causal decoder's first
step (latent frame 0) and later steps; an LTX decoder's first step of ``1 + lookahead`` latent
frames and later steps of one; a whole-clip decode (HunyuanVideo 1.0); an image's one program
(``AutoencoderKL``, Flux.2, and Qwen-Image's image or one-frame clip); and the encode.

A family plugs in with a ``Family`` entry in ``FAMILIES`` (its layers, its coefficients); a family
without one has no estimate (``estimator`` returns None) and its programs are checked after they
are compiled only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from .config import HunyuanVideo15Config, HunyuanVideoConfig, VAEConfig, WanVAEConfig
from .image_config import AutoencoderKLConfig, AutoencoderKLFlux2Config, QwenImageConfig
from .ltx_config import LTX2VideoConfig, LTXVideoConfig
from .shapes import FRAMES_PER_CHUNK, Output, latents_for_frames, output_frames

BYTES = {"float32": 4, "bfloat16": 2}
# models.conv.CPU_BLOCK_BYTES: a CPU conv's nine-tap buffers per block, at most.
CPU_BLOCK_BYTES = 128 * 2**20
# models.decoder.STREAM_MIN_FRAME_BYTES: after a temporal upsampler, frames go one at a time once a
# full-resolution frame holds this much.
STREAM_MIN_FRAME_BYTES = 4 * 2**20
# models.hunyuan.CLIP_BLOCK_BYTES: HunyuanVideo 1.0's whole-clip convs take this much of a clip per block.
CLIP_BLOCK_BYTES = 256 * 2**20
LTXConfig = LTXVideoConfig | LTX2VideoConfig
QUERY_CHUNK = 4096  # sharding's query_chunk default: attention scores per block of queries
CONDITION_BYTES = 16  # models.ltx.DecodeConditions per row: float32 timestep and noise scale, a uint32 key pair
# How a program's convolutions are compiled: on CPU, models.conv.CPU_CONVS ("matmul": nine-tap matmuls;
# "onednn": oneDNN's convolutions, nine-tap matmuls left for the upsamplers' phase convs and the
# kernel-bound ones); "native": an accelerator's.
Convs = Literal["matmul", "onednn", "native"]
CONVS: tuple[Convs, ...] = ("matmul", "onednn", "native")


# -- a network, as the estimate sees it --------------------------------------------------------------
@dataclass(frozen=True)
class Conv:
    """One convolution of a program: the frames it takes at once (in one step, one frame group or
    one block of a clip), its grid (``scale`` rows per latent row), its channels, and what it keeps
    from step to step: ``"padded"`` (two frames of its padded input), ``"plain"`` (two unpadded
    frames: a time conv) or None. ``clip_frames``: the frames of the tensor it reads and writes
    (more than ``frames`` when a whole clip is convolved block by block)."""

    frames: int
    scale: float
    cin: int
    cout: int
    cache: str | None = "padded"
    clip_frames: int = 0


@dataclass(frozen=True)
class Attention:
    """An attention layer: ``queries`` of each device against ``keys`` (gathered from every band),
    ``dim`` channels, ``kept``: keys and values a step keeps for later ones (HunyuanVideo 1.5)."""

    queries: int
    keys: int
    dim: int
    kept: int = 0


@dataclass(frozen=True)
class Kept:
    """Frames a step keeps for the next one without convolving them: an LTX residual's delay line
    (``frames`` unpadded frames of ``channels`` at ``scale`` rows per latent row)."""

    frames: int
    scale: float
    channels: int


Layer = Conv | Attention | Kept


@dataclass(frozen=True)
class Grid:
    """What a device holds of a program's input: ``batch`` rows of ``rows x cols`` latent pixels (its
    band; ``full_rows`` the frame's), ``frames`` latent frames in this step (or clip)."""

    batch: int
    rows: int
    cols: int
    full_rows: int
    frames: int
    clip_frames: int


# -- the features of a program, and what they weigh ------------------------------------------------
@dataclass(frozen=True)
class Features:
    """Element counts (per device) that a program's working memory is made of."""

    caches: int  # causal caches (elements, model dtype)
    activation: int  # the largest conv's input + output (elements)
    outputs: int  # every conv's output, summed (elements): what a step holds if little is reused
    taps: int  # the largest nine-tap matmul block (float32 elements; 0 for native convs)
    attention: int  # scores of one block of queries + gathered keys and values (float32 elements)
    weights: int = 0  # bytes of the program's weights (kernels are reshaped for the convs)


@dataclass(frozen=True)
class Coefficients:
    """How much of each feature a family's compiled programs hold as temp, for one conv path.

    Fitted (on the ratio estimate / compiled) to ``memory_analysis()`` of the family's programs;
    see ``bench/memory.py`` and ``Family`` (one table per conv path)."""

    caches: float
    activation: float
    outputs: float
    taps: float
    attention: float
    weights: float

    def temp(self, features: Features, itemsize: int) -> int:
        return int(itemsize * (self.caches * features.caches + self.activation * features.activation
                               + self.outputs * features.outputs)
                   + 4 * (self.taps * features.taps + self.attention * features.attention)
                   + self.weights * features.weights)


@dataclass(frozen=True)
class Estimate:
    """Estimated bytes per device of one program, as ``memory_analysis()`` splits them (``total`` =
    arguments + outputs − aliased + temp). ``weighed``: the features its temp was weighed from
    (what ``bench.memory --fit`` fits the coefficients to)."""

    argument: int
    output: int
    alias: int
    temp: int
    weighed: Features | None = dataclasses.field(default=None, compare=False)

    @property
    def total(self) -> int:
        return self.argument + self.output - self.alias + self.temp


def features(layers: list[Layer], grid: Grid, *, native: bool) -> Features:
    """The features of a program made of ``layers`` over ``grid`` (per device); ``native``: no
    nine-tap buffers (an accelerator's convolutions). On CPU every conv's nine-tap block is
    counted under either conv path; oneDNN's programs keep such blocks only for the upsamplers'
    phase convs, and their fitted coefficients weigh the feature accordingly (mostly 0)."""
    b, h, w = grid.batch, grid.rows, grid.cols
    caches = activation = outputs = taps = attention = 0
    for layer in layers:
        if isinstance(layer, Attention):
            scores = b * min(QUERY_CHUNK, layer.queries) * layer.keys
            attention = max(attention, scores + 2 * b * (layer.keys + layer.kept) * layer.dim)
            caches += 2 * b * layer.kept * layer.dim
            continue
        if isinstance(layer, Kept):
            caches += b * layer.frames * math.ceil(layer.scale * h) * math.ceil(layer.scale * w) * layer.channels
            continue
        rows, cols = math.ceil(layer.scale * h), math.ceil(layer.scale * w)
        pixels = rows * cols
        if layer.cache == "padded":
            caches += 2 * b * (rows + 2) * (cols + 2) * layer.cin
        elif layer.cache == "plain":
            caches += 2 * b * pixels * layer.cin
        clip = max(layer.frames, layer.clip_frames)
        activation = max(activation, b * clip * pixels * (layer.cin + layer.cout))
        outputs += b * clip * pixels * layer.cout
        if not native:
            block = b * layer.frames * (rows + 2) * (cols + 2) * 9 * layer.cout
            taps = max(taps, min(block, CPU_BLOCK_BYTES // 4))
    return Features(caches, activation, outputs, taps, attention)


def cache_bytes(layers: list[Layer], grid: Grid, itemsize: int) -> int:
    """The causal caches a step keeps, in bytes (exact for the Wan and HunyuanVideo 1.5 layers)."""
    return itemsize * features(layers, grid, native=True).caches


# -- Wan 2.1 / 2.2 ---------------------------------------------------------------------------------
def _residual(frames: int, scale: float, cin: int, cout: int) -> list[Conv]:
    return [Conv(frames, scale, cin, cout), Conv(frames, scale, cout, cout)]


def wan_decoder(config: WanVAEConfig, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of one decode step of a Wan decoder (``models.decoder``)."""
    dims = config.decoder_dims
    frames = 1 if first else grid.frames
    layers: list[Layer] = [Conv(frames, 1, config.z_dim, dims[0])]
    layers += _residual(frames, 1, dims[0], dims[0])
    layers.append(Attention(grid.rows * grid.cols, grid.full_rows * grid.cols, dims[0]))
    layers += _residual(frames, 1, dims[0], dims[0])
    stages = len(config.dim_mult)
    last_pixel = (2 ** (stages - 1)) ** 2 * dims[-1] * itemsize * grid.batch * grid.rows * grid.cols
    group = None if first or last_pixel < STREAM_MIN_FRAME_BYTES else 1
    scale, halves = 1, not config.is_residual
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        cin = cin // 2 if i > 0 and halves else cin
        for _ in range(config.num_res_blocks + 1):
            layers += _residual(frames, scale, cin, cout)
            cin = cout
        if i == stages - 1:
            continue
        if config.temperal_upsample[i]:
            layers.append(Conv(frames, scale, cout, 2 * cout, cache="plain"))
            frames = frames if first else 2 * frames
            frames = min(frames, group) if group else frames
        scale *= 2
        layers.append(Conv(frames, scale / 2, cout, 4 * (cout // 2 if halves else cout), cache=None))
    layers.append(Conv(frames, scale, dims[-1], config.out_channels))
    return layers


def wan_first_step_unused(config: WanVAEConfig) -> int:
    """Parameters latent frame 0 does not use (its upsamplers skip their time convs): the compiled
    first step does not take them."""
    dims = config.decoder_dims
    return sum(3 * cout * 2 * cout + 2 * cout
               for cout, temporal in zip(dims[1:], config.temperal_upsample, strict=False) if temporal)


def wan_encoder(config: WanVAEConfig, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of one encode step of a Wan encoder (``models.encoder``): frame 0, or 4 frames."""
    del itemsize
    dims = tuple(config.base_dim * m for m in (1, *config.dim_mult))
    frames = 1 if first else FRAMES_PER_CHUNK
    scale: float = 2 ** (len(config.dim_mult) - 1)  # rows of the (patchified) input per latent row
    layers: list[Layer] = [Conv(frames, scale, config.in_channels, dims[0])]
    for stage, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        for _ in range(config.num_res_blocks):
            layers += _residual(frames, scale, cin, cout)
            cin = cout
        if stage == len(config.dim_mult) - 1:
            continue
        layers.append(Conv(frames, scale / 2, 4 * cout, cout, cache=None))  # stride-2 conv, seen at the output
        scale /= 2
        if config.temperal_downsample[stage] and not first:
            layers.append(Conv(frames, scale, cout, cout, cache="plain"))
            frames //= 2
    layers += _residual(frames, scale, dims[-1], dims[-1])
    layers.append(Attention(grid.rows * grid.cols, grid.full_rows * grid.cols, dims[-1]))
    layers += _residual(frames, scale, dims[-1], dims[-1])
    layers.append(Conv(frames, scale, dims[-1], 2 * config.z_dim))
    return layers


# -- HunyuanVideo 1.5 -------------------------------------------------------------------------------
def hunyuan15_decoder(config: HunyuanVideo15Config, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of one decode step of HunyuanVideo 1.5 (``models.hunyuan15``)."""
    del itemsize
    dims = config.decoder_channels
    frames = 1 if first else grid.frames
    tokens, keys = grid.rows * grid.cols, grid.full_rows * grid.cols
    layers: list[Layer] = [Conv(frames, 1, config.latent_channels, dims[0])]
    layers += _residual(frames, 1, dims[0], dims[0])
    layers.append(Attention(frames * tokens, grid.clip_frames * keys, dims[0], kept=grid.clip_frames * tokens))
    layers += _residual(frames, 1, dims[0], dims[0])
    scale = 1
    for cin, cout, up, temporal in config.up_blocks():
        for _ in range(config.layers_per_block + 1):
            layers += _residual(frames, scale, cin, cout)
            cin = cout
        if up is not None:
            layers.append(Conv(frames, scale, cout, up * (8 if temporal else 4)))
            frames = frames if first or not temporal else 2 * frames
            scale *= 2
    layers.append(Conv(frames, scale, dims[-1], config.out_channels))
    return layers


def hunyuan15_encoder(config: HunyuanVideo15Config, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of one encode step of HunyuanVideo 1.5: frame 0, or 4 frames."""
    del itemsize
    frames = 1 if first else FRAMES_PER_CHUNK
    scale: float = config.spatial_compression_ratio
    dims = config.block_out_channels
    layers: list[Layer] = [Conv(frames, scale, config.in_channels, dims[0])]
    for cin, cout, down, temporal in config.down_blocks():
        for _ in range(config.layers_per_block):
            layers += _residual(frames, scale, cin, cout)
            cin = cout
        if down is not None:
            layers.append(Conv(frames, scale, cout, down // (8 if temporal else 4)))
            scale /= 2
            frames = frames if first or not temporal else frames // 2
    layers += _residual(frames, scale, dims[-1], dims[-1])
    layers.append(Attention(frames * grid.rows * grid.cols, frames * grid.full_rows * grid.cols, dims[-1]))
    layers += _residual(frames, scale, dims[-1], dims[-1])
    layers.append(Conv(frames, scale, dims[-1], 2 * config.latent_channels))
    return layers


# -- HunyuanVideo 1.0: the whole clip at once ---------------------------------------------------------
def _block(frames: int, pixels: int, channels: int, itemsize: int) -> int:
    """Frames of a whole-clip conv taken per block (``models.hunyuan.block_frames``)."""
    return max(1, min(frames, CLIP_BLOCK_BYTES // max(1, pixels * channels * itemsize)))


def hunyuan_decoder(config: HunyuanVideoConfig, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of HunyuanVideo 1.0's whole-clip decode (``models.hunyuan``): every conv reads and
    writes the whole clip, block by block in time."""
    del first
    dims = tuple(reversed(config.block_out_channels))
    frames, scale = grid.clip_frames, 1
    tokens = grid.rows * grid.cols

    def conv(cin: int, cout: int) -> Conv:
        pixels = grid.batch * math.ceil(scale * grid.rows) * math.ceil(scale * grid.cols)
        return Conv(_block(frames, pixels, cin, itemsize), scale, cin, cout, cache=None, clip_frames=frames)

    layers: list[Layer] = [conv(config.latent_channels, dims[0]), conv(dims[0], dims[0]), conv(dims[0], dims[0])]
    if config.mid_block_add_attention:
        layers.append(Attention(frames * tokens, frames * grid.full_rows * grid.cols, dims[0]))
    layers += [conv(dims[0], dims[0]), conv(dims[0], dims[0])]
    for cin, cout, (temporal, spatial) in zip((dims[0], *dims[:-1]), dims, config.up_factors(), strict=True):
        for _ in range(config.layers_per_block + 1):
            layers += [conv(cin, cout), conv(cout, cout)]
            cin = cout
        if temporal or spatial:
            frames = 1 + 2 * (frames - 1) if temporal else frames
            scale *= 2 if spatial else 1
            layers.append(conv(cout, cout))
    layers.append(conv(dims[-1], config.out_channels))
    return layers


def hunyuan_encoder(config: HunyuanVideoConfig, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of HunyuanVideo 1.0's whole-clip encode."""
    del first
    dims = config.block_out_channels
    frames, scale = grid.clip_frames, float(config.spatial_compression_ratio)

    def conv(cin: int, cout: int) -> Conv:
        pixels = grid.batch * math.ceil(scale * grid.rows) * math.ceil(scale * grid.cols)
        return Conv(_block(frames, pixels, cin, itemsize), scale, cin, cout, cache=None, clip_frames=frames)

    layers: list[Layer] = [conv(config.in_channels, dims[0])]
    cin = dims[0]
    for cout, (temporal, spatial) in zip(dims, config.down_factors(), strict=True):
        for _ in range(config.layers_per_block):
            layers += [conv(cin, cout), conv(cout, cout)]
            cin = cout
        if temporal or spatial:
            layers.append(conv(cout, cout))
            frames = 1 + (frames - 1) // 2 if temporal else frames
            scale /= 2 if spatial else 1
    layers += [conv(dims[-1], dims[-1])] * 2
    if config.mid_block_add_attention:
        layers.append(Attention(frames * grid.rows * grid.cols, frames * grid.full_rows * grid.cols, dims[-1]))
    layers += [conv(dims[-1], dims[-1])] * 2 + [conv(dims[-1], 2 * config.latent_channels)]
    return layers


# -- the image VAEs: AutoencoderKL (SD, SDXL, SD3, Flux.1), Flux.2, Qwen-Image ------------------------
def kl_decoder(config: AutoencoderKLConfig | AutoencoderKLFlux2Config, grid: Grid, *, first: bool,
               itemsize: int) -> list[Layer]:
    """The layers of an ``AutoencoderKL``'s whole-image decode (``models.kl``): 2-D convs, no caches,
    the mid block's attention over every token of the image."""
    del first, itemsize
    dims = tuple(reversed(config.decoder_channels))
    frames, scale = grid.frames, 1

    def conv(cin: int, cout: int) -> Conv:
        return Conv(frames, scale, cin, cout, cache=None)

    layers: list[Layer] = [conv(config.latent_channels, dims[0]), conv(dims[0], dims[0]), conv(dims[0], dims[0])]
    if config.mid_block_add_attention:
        layers.append(Attention(frames * grid.rows * grid.cols, frames * grid.full_rows * grid.cols, dims[0]))
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

    def conv(cin: int, cout: int) -> Conv:
        return Conv(frames, scale, cin, cout, cache=None)

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
        layers.append(Attention(frames * grid.rows * grid.cols, frames * grid.full_rows * grid.cols, dims[-1]))
    layers += [conv(dims[-1], dims[-1])] * 2 + [conv(dims[-1], 2 * config.latent_channels)]
    return layers


def flux2_unused(config: AutoencoderKLFlux2Config) -> int:
    """Flux.2's ``bn`` statistics: kept with the weights, not used by the decode (not compiled in)."""
    return 2 * config.batch_norm_channels


def wan21_frame_encode_unused(config: WanVAEConfig) -> int:
    """Parameters the encode of one frame does not use: its temporal downsamplers' time convs."""
    dims = tuple(config.base_dim * m for m in (1, *config.dim_mult))
    return sum(3 * cout * cout + cout for cout, temporal in zip(dims[1:], config.temperal_downsample, strict=False)
               if temporal)


def on_wan(function: Callable[..., Any]) -> Callable[..., Any]:
    """A Wan 2.1 function of this module, on Qwen-Image's config: its VAE is Wan 2.1's
    (``QwenImageConfig.wan()``)."""
    def on_qwen(config: QwenImageConfig, *args: Any, **kwargs: Any) -> Any:
        return function(config.wan(), *args, **kwargs)
    return on_qwen


# -- LTX-Video, LTX-2 --------------------------------------------------------------------------------
def ltx_decoder(config: LTXConfig, grid: Grid, *, first: bool, itemsize: int) -> list[Layer]:
    """The layers of one decode step of an LTX decoder (``models.ltx_vae``): the first step's
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
        layers.append(Conv(frames, scale, cin, cout))
        frames -= 1 if first and ahead else 0

    def resnet(cin: int, cout: int) -> None:
        conv(cin, cout)
        conv(cout, cout)
        if ahead:
            layers.append(Kept(2, scale, cin))

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
                layers.append(Kept(1, scale, cin))
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
        return [Conv(frames, scale, cin, cout), Conv(frames, scale, cout, cout)]

    layers: list[Layer] = [Conv(frames, scale, 3 * plan.patch ** 2, plan.conv_in_channels)]
    for block in plan.down_blocks:
        for _ in range(block.layers):
            layers += resnet(block.cin, block.cin)
        if block.kind == "conv":  # a strided conv (it keeps one frame), then a resnet to cout
            scale /= 2
            layers.append(Conv(frames, scale, 8 * block.cin, block.cin, cache="plain"))
            frames = frames if first else max(1, frames // 2)
            if block.cin != block.cout:
                layers += resnet(block.cin, block.cout)
        elif block.kind is not None and block.stride is not None:
            time, space = block.stride
            layers.append(Conv(frames, scale, block.cin, block.cout // (time * space ** 2)))
            scale /= space
            frames = frames if first else max(1, frames // time)
        elif block.cin != block.cout:
            layers += resnet(block.cin, block.cout)
    for _ in range(plan.mid_layers):
        layers += resnet(plan.mid_channels, plan.mid_channels)
    layers.append(Conv(frames, scale, plan.mid_channels, plan.latent_channels + 1))
    return layers


# -- families ------------------------------------------------------------------------------------------
Walk = Callable[..., list[Layer]]
Table = dict[str, Coefficients]  # by program: "decode" (a step, or a whole-clip decode), "encode"


@dataclass(frozen=True)
class Family:
    """What the estimate knows of a family: its decoder's and encoder's layers, and its coefficients
    by program (``"decode"``, ``"encode"``), for each conv path (``Convs``; ``matmul``: the
    nine-tap CPU convs; ``onednn``: oneDNN's CPU convs, the matmul path's when None, which
    overstates them; ``native``: accelerators' convolutions, None until measured there — the
    matmul path's are used, with no nine-tap buffers to count)."""

    decoder: Walk
    encoder: Walk
    matmul: Table
    onednn: Table | None = None
    native: Table | None = None
    first_step_unused: Callable[..., int] = lambda config: 0  # parameters the first decode step leaves out
    frame_encode_unused: Callable[..., int] = lambda config: 0  # parameters the encode of one frame leaves out


def _c(caches: float, activation: float, outputs: float, taps: float, attention: float, weights: float) -> Coefficients:
    return Coefficients(caches=caches, activation=activation, outputs=outputs, taps=taps, attention=attention,
                        weights=weights)


# AutoencoderKL's and Flux.2's nine-tap coefficients, fitted over both (the same layers).
KL_MATMUL: Table = {"decode": _c(0.0, 0.0, 1.018, 0.389, 0.0, 0.157), "encode": _c(0.0, 0.0, 0.0, 2.537, 0.588, 0.0)}

# Fitted to memory_analysis() on XLA:CPU, one table per CPU conv path. ``matmul``: the video
# families' of the tiny test configs at several sizes and of the real configs at small and 480p
# sizes (the printed table is in docs/serving.md, "No out-of-memory surprises"); the image and LTX
# families': minimax fits (the least largest |estimate / compiled − 1|, non-negative; `python -m
# bench.memory --fit FAMILY` prints them beside a least-squares fit with larger shapes held out)
# over every tiny-config shape `bench.memory`'s `tiny_configs` lists, some features left out per
# program (`--features`); AutoencoderKL and Flux.2 share theirs, fitted over both. ``onednn``: minimax
# fits over every family's tiny configs (`python -m bench.memory --fit FAMILY --cpu-convs onednn`),
# the video families' with their real configs' decodes and encodes (`--real`) and the attention's scores and
# keys counted once (`--fix attention=1`, as the LTX families', whose tiny configs have none).
FAMILIES: dict[str, Family] = {
    "wan2.1": Family(wan_decoder, wan_encoder,
                     matmul={"decode": _c(0.667, 1.006, 0.0, 1.640, 1.0, 0.0), "encode": _c(0.0, 6.303, 0.0, 2.175, 1.0, 0.250)},
                     onednn={"decode": _c(0.59, 0.315, 0.0, 0.509, 1.0, 0.0), "encode": _c(0.0, 1.861, 0.599, 0.0, 1.0, 0.163)},
                     first_step_unused=wan_first_step_unused, frame_encode_unused=wan21_frame_encode_unused),
    "wan2.2": Family(wan_decoder, wan_encoder,
                     matmul={"decode": _c(0.872, 0.379, 0.0, 0.464, 1.0, 0.367), "encode": _c(0.0, 0.0, 1.556, 2.752, 1.0, 0.784)},
                     onednn={"decode": _c(0.614, 0.44, 0.0, 0.36, 1.0, 0.287), "encode": _c(0.0, 0.0, 1.025, 0.467, 1.0, 0.054)},
                     first_step_unused=wan_first_step_unused),
    "hunyuan1.5": Family(hunyuan15_decoder, hunyuan15_encoder,
                         matmul={"decode": _c(2.571, 0.0, 0.0, 1.906, 1.0, 0.340), "encode": _c(0.0, 0.0, 1.653, 2.632, 1.0, 0.953)},
                         onednn={"decode": _c(1.089, 0.0, 0.145, 0.078, 1.0, 0.015), "encode": _c(0.0, 3.869, 0.119, 0.0, 1.0, 0.0)}),
    "hunyuan1.0": Family(hunyuan_decoder, hunyuan_encoder,
                         matmul={"decode": _c(0.0, 3.604, 0.0, 0.108, 1.0, 0.532), "encode": _c(0.0, 0.0, 0.199, 2.188, 1.0, 1.295)},
                         # Its whole-clip temp is 3.5-3.7x the largest activation from 17 x 256x256 up
                         # (clips convolved in blocks), 1.4x at 9 x 128x128 (one block): 3.0 keeps
                         # every size measured within 0.83-1.47 (the large ones under 1.0).
                         onednn={"decode": _c(0.0, 3.0, 0.0, 0.0, 1.0, 0.0),
                                 "encode": _c(0.0, 0.0, 0.45, 0.159, 1.0, 0.183)}),
    # Images: tiny configs from 8x8 to 96x96 latents (768x768 frames). XLA:CPU's memory_analysis()
    # of the AutoencoderKL decode holds the mid block's scores only up to one block of queries
    # (4096 tokens), and the CPU convs' block budget bends the curves: 0.66-1.35.
    "autoencoder-kl": Family(kl_decoder, kl_encoder, matmul=KL_MATMUL,
                             onednn={"decode": _c(0.0, 0.0, 0.0, 0.309, 1.659, 1.149),
                                     "encode": _c(0.0, 0.0, 0.0, 0.275, 1.138, 0.0)}),
    "flux2": Family(kl_decoder, kl_encoder, matmul=KL_MATMUL,
                    onednn={"decode": _c(0.0, 0.0, 0.0, 0.275, 1.706, 0.468), "encode": _c(0.0, 0.0, 0.0, 0.285, 1.137, 0.0)},
                    first_step_unused=flux2_unused),
    "qwen-image": Family(on_wan(wan_decoder), on_wan(wan_encoder),
                         matmul={"decode": _c(0.175, 0.0, 0.0, 1.756, 0.0, 0.130), "encode": _c(0.0, 0.0, 0.0, 2.003, 0.0, 3.350)},
                         onednn={"decode": _c(0.0, 0.0, 0.0, 0.309, 1.876, 0.326),
                                 "encode": _c(0.0, 1.701, 0.0, 0.011, 1.606, 0.371)},
                         first_step_unused=on_wan(wan_first_step_unused),
                         frame_encode_unused=on_wan(wan21_frame_encode_unused)),
    "ltx-video": Family(ltx_decoder, ltx_encoder,
                        matmul={"decode": _c(3.164, 0.0, 0.0, 1.238, 1.0, 0.0), "encode": _c(0.0, 6.434, 0.0, 1.801, 1.0, 0.0)},
                        onednn={"decode": _c(0.376, 2.105, 0.0, 0.0, 1.0, 0.0), "encode": _c(0.0, 2.653, 0.0, 0.0, 1.0, 0.0)}),
    "ltx2": Family(ltx_decoder, ltx_encoder,
                   matmul={"decode": _c(0.357, 3.693, 2.057, 0.0, 1.0, 0.528), "encode": _c(0.0, 0.0, 0.0, 3.212, 1.0, 0.0)},
                   onednn={"decode": _c(0.0, 1.748, 0.0, 0.0, 1.0, 0.111), "encode": _c(0.0, 2.117, 0.0, 0.0, 1.0, 0.0)}),
}


def family_key(config: VAEConfig) -> str:
    """The entry of ``FAMILIES`` for a config: Wan 2.1 and 2.2 build different decoders."""
    if isinstance(config, WanVAEConfig):
        return "wan2.2" if config.is_residual else "wan2.1"
    return config.family


def _coefficients(family: Family, program: str, convs: Convs) -> Coefficients:
    table: Table | None = getattr(family, convs)  # the fields are named as the paths
    return (table or family.matmul)[program]


# -- the estimate ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Program:
    """A server's program, as far as memory goes: a decode step (``"first"``/``"next"``) or a whole
    decode or encode."""

    name: str
    estimate: Estimate


class Estimator:
    """Estimates for one model: its config, dtype, weights and mesh (``tp`` bands of each frame,
    ``dp`` replicas), its convolutions compiled as ``convs`` says (``Convs``; the default is the
    CPU's, as ``VAE.cpu_convs``)."""

    def __init__(self, config: VAEConfig, family: Family, *, dtype: str, decoder_parameters: int,
                 encoder_parameters: int, tp: int = 1, dp: int = 1, convs: Convs = "onednn"):
        if convs not in CONVS:
            raise ValueError(f"convs={convs!r}: expected one of {CONVS}")
        self.config, self.family, self.dtype = config, family, dtype
        self.itemsize = BYTES[dtype]
        self.decoder_weights = decoder_parameters * self.itemsize
        self.encoder_weights = encoder_parameters * self.itemsize
        self.tp, self.dp, self.convs = tp, dp, convs

    def _grid(self, batch: int, frames: int, rows: int, cols: int, clip_frames: int) -> Grid:
        band = math.ceil(rows / self.tp)
        return Grid(batch=max(1, batch // self.dp), rows=band, cols=cols, full_rows=band * self.tp,
                    frames=frames, clip_frames=clip_frames)

    def decode_steps(self, shape: tuple[int, ...], output: Output = "uint8") -> Iterator[Program]:
        """Every program a server runs to decode latents ``shape`` ``(B, C, T, H, W)`` (an image
        model's ``(B, C, H, W)`` too), step by step: one program for an image or a model that
        decodes the whole clip at once; else the first step and the later steps (one program: they
        take the same frames). A causal decoder's first step takes latent frame 0, its later ones a
        frame each; an LTX decoder that sees ahead takes ``1 + lookahead`` frames first (zeros past
        the clip's end), then a frame per step until every frame is out (``models.decode.stream_steps``)."""
        if len(shape) == 4:  # an image: one program, the whole image
            b, c, h, w = shape
            yield Program("whole", self._decode(self._grid(b, 1, h, w, 1), (b, c, 1, h, w), output, first=True,
                                                frames_out=1, steps=False))
            return
        b, c, t, h, w = shape
        config = self.config
        if not config.causal and config.lookahead is None:
            yield Program("whole", self._decode(self._grid(b, t, h, w, t), (b, c, t, h, w), output, first=True,
                                                frames_out=config.num_output_frames(t), steps=False))
            return
        ahead = config.lookahead or 0
        first_out = config.first_step_frames(1 + ahead) if isinstance(config, LTXConfig) else 1
        yield Program("first", self._decode(self._grid(b, 1, h, w, t), (b, c, 1 + ahead, h, w), output, first=True,
                                            frames_out=first_out, steps=True))
        if config.num_output_frames(t) > first_out:
            yield Program("next", self._decode(self._grid(b, 1, h, w, t), (b, c, 1, h, w), output, first=False,
                                               frames_out=config.temporal_scale, steps=True))

    def decode(self, shape: tuple[int, ...], output: Output = "uint8") -> Estimate:
        """The largest of ``decode_steps``: what a decode of ``shape`` needs per device."""
        return max((p.estimate for p in self.decode_steps(shape, output)), key=lambda e: e.total)

    def _decode(self, grid: Grid, inputs: tuple[int, ...], output: Output, *, first: bool, frames_out: int,
                steps: bool) -> Estimate:
        layers = self.family.decoder(self.config, grid, first=first, itemsize=self.itemsize)
        feats = features(layers, grid, native=self.convs == "native")
        scale = self.config.spatial_scale
        frames = grid.batch * frames_out * 3 * (scale * grid.rows) * (scale * grid.cols) * (4 if output == "float" else 1)
        latents = grid.batch * math.prod(inputs[1:]) * 4  # replicated over tp
        if self.config.decode_conditions:  # an LTX decoder's timestep, noise scale and key per row
            latents += grid.batch * CONDITION_BYTES
        caches = self.itemsize * feats.caches if steps else 0
        donated = caches if steps and not first else 0
        # A later step's caches are arguments (donated to its outputs); their updates cost temp too.
        weighed = dataclasses.replace(feats, caches=0 if first and steps else feats.caches, weights=self.decoder_weights)
        temp = _coefficients(self.family, "decode", self.convs).temp(weighed, self.itemsize)
        weights = self.decoder_weights
        if first and inputs[2] == 1:
            weights -= self.itemsize * self.family.first_step_unused(self.config)
        return Estimate(argument=weights + latents + (0 if first else caches), output=frames + caches, alias=donated,
                        temp=temp, weighed=weighed)

    def encode(self, shape: tuple[int, ...]) -> Estimate:
        """What the encode of frames ``shape`` ``(B, 3, F, H, W)`` (an image model's ``(B, 3, H, W)``
        too) needs per device (one program: frame 0, then steps of ``temporal_scale`` frames in a loop)."""
        if len(shape) == 4:
            shape = (shape[0], shape[1], 1, shape[2], shape[3])
        b, _, f, h, w = shape
        scale = self.config.spatial_scale
        rows, cols = h // scale, w // scale
        t = latents_for_frames(f, self.config.temporal_scale)
        grid = self._grid(b, 1, rows, cols, f)  # clip_frames: the input's (HunyuanVideo 1.0 encodes them at once)
        whole = not self.config.causal and self.config.lookahead is None  # one image, or the whole clip at once
        later = self.family.encoder(self.config, grid, first=whole or f == 1, itemsize=self.itemsize)
        feats = features(later, grid, native=self.convs == "native")
        frames = grid.batch * 3 * f * (scale * grid.rows) * (scale * grid.cols) * 4  # float32, a band
        latents = grid.batch * self.config.z_dim * t * grid.rows * grid.cols * 4
        weighed = dataclasses.replace(feats, weights=self.encoder_weights)
        temp = _coefficients(self.family, "encode", self.convs).temp(weighed, self.itemsize)
        weights = self.encoder_weights - (self.itemsize * self.family.frame_encode_unused(self.config) if f == 1 else 0)
        return Estimate(argument=weights + frames, output=latents, alias=0, temp=temp, weighed=weighed)


def estimator(config: VAEConfig, *, dtype: str, decoder_parameters: int, encoder_parameters: int = 0,
              tp: int = 1, dp: int = 1, convs: Convs = "onednn") -> Estimator | None:
    """The estimate for a model (every family of ``FAMILIES``: Wan 2.1/2.2, HunyuanVideo 1.0/1.5,
    LTX-Video, LTX-2, and the image VAEs ``AutoencoderKL``, Flux.2 and Qwen-Image), or None for a
    family without one (its programs are checked once compiled only)."""
    family = FAMILIES.get(family_key(config))
    if family is None:
        return None
    return Estimator(config, family, dtype=dtype, decoder_parameters=decoder_parameters,
                     encoder_parameters=encoder_parameters, tp=tp, dp=dp, convs=convs)


def output_bytes(config: VAEConfig, shape: tuple[int, ...], output: Output) -> int:
    """Bytes of the decoded frames of latents ``shape`` ``(B, C, T, H, W)`` on the host."""
    b, _, t, h, w = shape
    s = config.spatial_scale
    return b * output_frames(t, config.temporal_scale) * 3 * s * h * s * w * (4 if output == "float" else 1)
