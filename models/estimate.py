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

A family plugs in with the ``estimate`` module of its folder (``models/families/<name>/estimate.py``):
``family_estimate(config)`` gives its ``FamilyEstimate`` (its layers, its coefficients). A family
without one has no estimate (``estimator`` returns None) and its programs are checked after they
are compiled only.

The sizes the programs are built with and the estimate counts are declared here, once (no JAX):
``CPU_BLOCK_BYTES`` (``models.conv``), ``STREAM_MIN_FRAME_BYTES`` (``models.frame_groups``) and
``QUERY_CHUNK`` (the attention's block of queries, ``models.spatial`` and ``sharding``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from .conditions import CONDITION_BYTES
from .config import VAEConfig
from .shapes import Output, latents_for_frames, output_frames

BYTES = {"float32": 4, "bfloat16": 2}
# A CPU conv's nine-tap buffers per block, at most (``models.conv`` blocks its convs so).
CPU_BLOCK_BYTES = 128 * 2**20
# ``inner_frames=None`` streams one frame at a time once a full-resolution frame of a decoder's last
# stage (per device, before conv_out) holds this many bytes (``models.frame_groups.stream_group``);
# smaller frames keep the whole step together: a step of them is a few MB anyway, and an inner loop
# would only add iterations.
STREAM_MIN_FRAME_BYTES = 4 * 2**20
# Attention scores are computed a block of this many queries at a time (``models.spatial``, ``sharding``).
QUERY_CHUNK = 4096
# How a program's convolutions are compiled: on CPU, models.conv.CPU_CONVS ("matmul": nine-tap matmuls;
# "onednn": oneDNN's convolutions, nine-tap matmuls left for the upsamplers' phase convs and the
# kernel-bound ones); "native": an accelerator's.
Convs = Literal["matmul", "onednn", "native"]
CONVS: tuple[Convs, ...] = ("matmul", "onednn", "native")


# -- a network, as the estimate sees it --------------------------------------------------------------
@dataclass(frozen=True)
class ConvLayer:
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
class AttentionLayer:
    """An attention layer: ``queries`` of each device against ``keys`` (gathered from every band),
    ``dim`` channels, ``kept``: keys and values a step keeps for later ones (HunyuanVideo 1.5)."""

    queries: int
    keys: int
    dim: int
    kept: int = 0


@dataclass(frozen=True)
class KeptFrames:
    """Frames a step keeps for the next one without convolving them: an LTX residual's delay line
    (``frames`` unpadded frames of ``channels`` at ``scale`` rows per latent row)."""

    frames: int
    scale: float
    channels: int


@dataclass(frozen=True)
class Tensor:
    """A tensor a program holds whole, whatever the grid's bands: ``elements`` of it, counted as a
    conv's output is (MiniMax-H3's decoded tiles and stitched frames: its work is spread by tiles,
    not bands)."""

    elements: int


Layer = ConvLayer | AttentionLayer | KeptFrames | Tensor


@dataclass(frozen=True)
class Grid:
    """What a device holds of a program's input: ``batch`` rows of ``rows x cols`` latent pixels (its
    band; ``full_rows`` the frame's, padded to whole bands; ``frame_rows`` the frame's as given, 0
    where not known), ``frames`` latent frames in this step (or clip)."""

    batch: int
    rows: int
    cols: int
    full_rows: int
    frames: int
    clip_frames: int
    frame_rows: int = 0


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
    see ``bench/memory.py`` and ``FamilyEstimate`` (one table per conv path)."""

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
    phase convs, and their fitted coefficients weigh the feature accordingly (mostly 0). A batch's
    rows run one at a time (``models.rows``): the caches are the batch's, the working set a row's."""
    b, h, w = grid.batch, grid.rows, grid.cols
    caches = activation = outputs = taps = attention = 0
    for layer in layers:
        if isinstance(layer, AttentionLayer):
            scores = min(QUERY_CHUNK, layer.queries) * layer.keys
            attention = max(attention, scores + 2 * (layer.keys + layer.kept) * layer.dim)
            caches += 2 * b * layer.kept * layer.dim
            continue
        if isinstance(layer, KeptFrames):
            caches += b * layer.frames * math.ceil(layer.scale * h) * math.ceil(layer.scale * w) * layer.channels
            continue
        if isinstance(layer, Tensor):
            activation, outputs = max(activation, layer.elements), outputs + layer.elements
            continue
        rows, cols = math.ceil(layer.scale * h), math.ceil(layer.scale * w)
        pixels = rows * cols
        if layer.cache == "padded":
            caches += 2 * b * (rows + 2) * (cols + 2) * layer.cin
        elif layer.cache == "plain":
            caches += 2 * b * pixels * layer.cin
        clip = max(layer.frames, layer.clip_frames)
        activation = max(activation, clip * pixels * (layer.cin + layer.cout))
        outputs += clip * pixels * layer.cout
        if not native:
            block = layer.frames * (rows + 2) * (cols + 2) * 9 * layer.cout
            taps = max(taps, min(block, CPU_BLOCK_BYTES // 4))
    return Features(caches, activation, outputs, taps, attention)


def cache_bytes(layers: list[Layer], grid: Grid, itemsize: int) -> int:
    """The causal caches a step keeps, in bytes (exact for the Wan and HunyuanVideo 1.5 layers)."""
    return itemsize * features(layers, grid, native=True).caches


# -- families ------------------------------------------------------------------------------------------
Walk = Callable[..., list[Layer]]
Table = dict[str, Coefficients]  # by program: "decode" (a step, or a whole-clip decode), "encode"


def residual_convs(frames: int, scale: float, cin: int, cout: int) -> list[ConvLayer]:
    """A residual block's two 3x3x3 convs (its shortcut is pointwise: not counted)."""
    return [ConvLayer(frames, scale, cin, cout), ConvLayer(frames, scale, cout, cout)]


def _nothing_unused(config: Any) -> int:
    del config
    return 0


def _one_frame_first(config: Any, latent_frames: int) -> int:
    del config, latent_frames
    return 1


@dataclass(frozen=True)
class FamilyEstimate:
    """What the estimate knows of a family: its decoder's and encoder's layers, and its coefficients
    by program (``"decode"``, ``"encode"``), for each conv path (``Convs``; ``matmul``: the
    nine-tap CPU convs; ``onednn``: oneDNN's CPU convs, the matmul path's when None, which
    overstates them; ``native``: accelerators' convolutions, None until measured there — the
    matmul path's are used, with no nine-tap buffers to count). ``first_step_frames(config, n)``:
    the frames a first decode step of ``n`` latent frames gives (1 but for a decoder that sees ahead)."""

    decoder: Walk
    encoder: Walk
    matmul: Table
    onednn: Table | None = None
    native: Table | None = None
    first_step_unused: Callable[..., int] = _nothing_unused  # parameters the first decode step leaves out
    frame_encode_unused: Callable[..., int] = _nothing_unused  # parameters the encode of one frame leaves out
    first_step_frames: Callable[..., int] = _one_frame_first


# Every family's tables (in its folder's estimate.py) are fitted to memory_analysis() on XLA:CPU, one
# table per CPU conv path. ``matmul``: the video
# families' of the tiny test configs at several sizes and of the real configs at small and 480p
# sizes (the printed table is in docs/serving.md, "No out-of-memory surprises"); the image and LTX
# families': minimax fits (the least largest |estimate / compiled − 1|, non-negative; `python -m
# bench.memory --fit FAMILY` prints them beside a least-squares fit with larger shapes held out)
# over every tiny-config shape `bench.memory`'s `tiny_configs` lists, some features left out per
# program (`--features`); AutoencoderKL and Flux.2 share theirs, fitted over both. ``onednn``: minimax
# fits over every family's tiny configs (`python -m bench.memory --fit FAMILY --cpu-convs onednn`),
# the video families' with their real configs' decodes and encodes (`--real`) and the attention's scores and
# keys counted once (`--fix attention=1`, as the LTX families', whose tiny configs have none).
def coefficients(caches: float, activation: float, outputs: float, taps: float, attention: float,
                 weights: float) -> Coefficients:
    """``Coefficients`` positionally, as the fitted tables write them."""
    return Coefficients(caches=caches, activation=activation, outputs=outputs, taps=taps, attention=attention,
                        weights=weights)


def _coefficients(family: FamilyEstimate, program: str, convs: Convs) -> Coefficients:
    table: Table | None = getattr(family, convs)  # the fields are named as the paths
    return (table or family.matmul)[program]


# -- the estimate ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProgramEstimate:
    """A server's program, as far as memory goes: a decode step (``"first"``/``"next"``) or a whole
    decode or encode."""

    name: str
    estimate: Estimate


class Estimator:
    """Estimates for one model: its config, dtype, weights and mesh (``tp`` bands of each frame,
    ``dp`` replicas), its convolutions compiled as ``convs`` says (``Convs``; the default is the
    CPU's, as ``VAE.cpu_convs``)."""

    def __init__(self, config: VAEConfig, family: FamilyEstimate, *, dtype: str, decoder_parameters: int,
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
                    frames=frames, clip_frames=clip_frames, frame_rows=rows)

    def decode_steps(self, shape: tuple[int, ...], output: Output = "uint8") -> Iterator[ProgramEstimate]:
        """Every program a server runs to decode latents ``shape`` ``(B, C, T, H, W)`` (an image
        model's ``(B, C, H, W)`` too), step by step: one program for an image or a model that
        decodes the whole clip at once; else the first step and the later steps (one program: they
        take the same frames). A causal decoder's first step takes latent frame 0, its later ones a
        frame each; an LTX decoder that sees ahead takes ``1 + lookahead`` frames first (zeros past
        the clip's end), then a frame per step until every frame is out (``models.decode.stream_steps``)."""
        if len(shape) == 4:  # an image: one program, the whole image
            b, c, h, w = shape
            yield ProgramEstimate("whole", self._decode(self._grid(b, 1, h, w, 1), (b, c, 1, h, w), output, first=True,
                                                frames_out=1, steps=False))
            return
        b, c, t, h, w = shape
        config = self.config
        if not config.causal and config.lookahead is None:
            yield ProgramEstimate("whole", self._decode(self._grid(b, t, h, w, t), (b, c, t, h, w), output, first=True,
                                                frames_out=config.num_output_frames(t), steps=False))
            return
        ahead = config.lookahead or 0
        first_out = self.family.first_step_frames(config, 1 + ahead)
        yield ProgramEstimate("first", self._decode(self._grid(b, 1, h, w, t), (b, c, 1 + ahead, h, w), output, first=True,
                                            frames_out=first_out, steps=True))
        if config.num_output_frames(t) > first_out:
            yield ProgramEstimate("next", self._decode(self._grid(b, 1, h, w, t), (b, c, 1, h, w), output, first=False,
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


def family_estimate(config: VAEConfig) -> FamilyEstimate | None:
    """The ``FamilyEstimate`` of a config's family (its folder's ``estimate`` module), or None for a
    family without one."""
    from .registry import family_of

    module = family_of(config).part("estimate")
    return None if module is None else module.family_estimate(config)


def estimator(config: VAEConfig, *, dtype: str, decoder_parameters: int, encoder_parameters: int = 0,
              tp: int = 1, dp: int = 1, convs: Convs = "onednn") -> Estimator | None:
    """The estimate for a model (every family whose folder has an ``estimate`` module), or None for a
    family without one (its programs are checked once compiled only)."""
    family = family_estimate(config)
    if family is None:
        return None
    return Estimator(config, family, dtype=dtype, decoder_parameters=decoder_parameters,
                     encoder_parameters=encoder_parameters, tp=tp, dp=dp, convs=convs)


def output_bytes(config: VAEConfig, shape: tuple[int, ...], output: Output) -> int:
    """Bytes of the decoded frames of latents ``shape`` ``(B, C, T, H, W)`` on the host."""
    b, _, t, h, w = shape
    s = config.spatial_scale
    return b * output_frames(t, config.temporal_scale) * 3 * s * h * s * w * (4 if output == "float" else 1)
