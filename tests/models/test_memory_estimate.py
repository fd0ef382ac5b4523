"""The estimate a server refuses hopeless requests with (``models.memory``), against the compiled
programs' ``memory_analysis()``: every family, the programs a server runs (each decode step, a
whole-clip decode, an encode), several shapes each, tp = 1 and 2 (Wan 2.1's bands, MiniMax-H3's
tiles), with the CPU's default convs (oneDNN's) and, for two families, the nine-tap matmul convs (``--cpu-convs matmul``).

Bounds: arguments and outputs are counted exactly (weights, inputs, output frames, the causal
caches a step keeps and donates); the total within [0.7, 1.5] of the compiled one. A server
refuses before compiling only past 1.5x its memory (``service.engine.memory.ESTIMATE_MARGIN``),
so an estimate in these bounds never refuses a program that fits. Negative control: the exact
parts alone (no working memory) fall far below the compiled totals, so the bounds are not loose
enough to pass a estimate that forgot the temp.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.helpers.hunyuan_reference import HY10_TINY, HY15_TINY
from tests.helpers.image_reference import FLUX2_TINY, QWEN_TINY, SD_TINY
from tests.helpers.ltx_reference import LTX095, LTX23
from vaeserve import models, sharding
from vaeserve.models.conv import convs_for
from vaeserve.models.estimate import estimator
from vaeserve.models.families.minimax_h3.config import AutoencoderKLMiniMaxH3Config
from vaeserve.sharding.fits import program_total_bytes
from vaeserve.sharding.introspect import program_memory

LOW, HIGH = 0.7, 1.5
BESIDE = 1024  # bytes: counts, tuple tables

# (config, decode latent shapes, encode frame shapes): tiny configs, few compiles.
FAMILIES: dict[str, tuple[models.VAEConfig, list[tuple[int, ...]], list[tuple[int, ...]]]] = {
    "wan21": (models.WanVAEConfig(base_dim=8, num_res_blocks=1), [(1, 16, 3, 8, 8), (2, 16, 3, 12, 12)],
              [(1, 3, 5, 32, 32)]),
    "wan22": (models.WanVAEConfig.wan22(base_dim=8, decoder_base_dim=8, num_res_blocks=1, dim_mult=(1, 2, 2),
                                        temperal_downsample=(False, True), scale_factor_spatial=8,
                                        scale_factor_temporal=2), [(1, 48, 3, 8, 8), (2, 48, 3, 8, 12)],
              [(1, 3, 5, 32, 32)]),
    "hunyuan10": (HY10_TINY, [(1, 16, 3, 8, 8), (2, 16, 2, 8, 12)], [(1, 3, 5, 32, 32)]),
    "hunyuan15": (HY15_TINY, [(1, 16, 3, 4, 4), (2, 16, 3, 4, 6)], [(1, 3, 5, 32, 32)]),
    # Images: one program each (Qwen-Image's one-frame clip is its decoder's first step).
    "autoencoder-kl": (SD_TINY, [(2, 4, 12, 16)], [(1, 3, 32, 32)]),
    "flux2": (FLUX2_TINY, [(1, 8, 8, 8)], []),  # AutoencoderKL's encoder
    "qwen-image": (QWEN_TINY, [(1, 16, 8, 8), (2, 16, 1, 12, 16)], [(1, 3, 64, 64)]),
    # LTX: the first step (1 + lookahead latent frames) and the later ones; timestep and noise arguments.
    "ltx-video": (LTX095, [(1, 8, 3, 4, 4), (1, 8, 3, 12, 16)], []),  # the LTX encoder: in ltx2's
    "ltx2": (LTX23, [(1, 8, 3, 4, 4)], [(1, 3, 9, 64, 64)]),
    # MiniMax-H3: its own tiled programs; a stream's first chunk (its whole-clip estimate stands for
    # each chunk's program): 1 and 2x3 tiles.
    "minimax-h3": (AutoencoderKLMiniMaxH3Config.tiny(), [(1, 4, 3, 4, 4), (2, 4, 5, 6, 8)], [(1, 3, 22, 24, 32)]),
}


# Latents decoded on two devices where a family's first shape does not do (MiniMax-H3's is one tile,
# nothing to spread): two videos of 2x3 tiles each, their 7 latent rows no whole number of bands (an
# estimate that took the bands' padded rows for the frame's counted 3x3 tiles: 1.23 of compiled).
TP2_DECODES: dict[str, list[tuple[int, ...]]] = {"minimax-h3": [(2, 4, 5, 7, 8)]}


def cases(name: str, tp: int = 1, *, shapes: int = 2, encode: bool = True, cpu_convs: str | None = None,
          decodes: list[tuple[int, ...]] | None = None):
    """``(shape, [(program, estimate, memory_analysis())] per program)``: the server's decode steps
    of each shape (first and later step, or the whole clip or image; ``decodes``: these shapes
    instead of the family's), then the encode; compiled with ``cpu_convs`` (None: the default)."""
    config, family_decodes, encodes = FAMILIES[name]
    decodes = family_decodes if decodes is None else decodes
    vae = models.init_vae(config)
    if cpu_convs is not None:
        vae.cpu_convs = cpu_convs
    mesh = sharding.make_mesh(tp)
    model = estimator(config, dtype="float32", decoder_parameters=vae.metadata["parameters"],
                      encoder_parameters=vae.metadata["encoder_parameters"], tp=tp, convs=convs_for("cpu", vae.cpu_convs))
    assert model is not None
    for shape in decodes[:shapes]:
        compiled = sharding.compile_decode_stream(vae, shape, mesh)
        programs = list(model.decode_steps(shape))
        assert len(programs) == len(compiled)
        yield shape, [(program.name, program.estimate, program_memory(step))
                      for program, step in zip(programs, compiled, strict=True)]
    for shape in encodes if encode else ():
        yield shape, [("encode", model.encode(shape), program_memory(sharding.compile_encode(vae, shape, mesh)))]


@pytest.fixture(scope="module")
def measured():
    """``measured(name)``: the family's ``cases``, compiled once for the module (on first use)."""
    found: dict[str, list] = {}

    def get(name: str) -> list:
        if name not in found:
            family, _, variant = name.partition(" ")
            found[name] = list(cases(family, tp=2, shapes=1, encode=False, decodes=TP2_DECODES.get(family))
                               if variant == "tp=2" else
                               cases(family, shapes=1, cpu_convs="matmul") if variant == "matmul" else cases(name))
        return found[name]

    return get


@pytest.mark.parametrize("name", [*FAMILIES, "wan21 tp=2", "minimax-h3 tp=2", "wan21 matmul", "ltx2 matmul"])
def test_the_estimate_is_within_bounds_of_memory_analysis(measured, name):
    ratios = {(shape, program): estimate.total / program_total_bytes(memory)
              for shape, programs in measured(name) for program, estimate, memory in programs}
    assert all(LOW <= r <= HIGH for r in ratios.values()), ratios
    # Negative control: without the working memory the same comparison fails.
    forgetful = [dataclasses.replace(estimate, temp=0).total / program_total_bytes(memory)
                 for _, programs in measured(name) for _, estimate, memory in programs]
    assert min(forgetful) < LOW, forgetful


@pytest.mark.parametrize("name", ["wan21", "wan22", "hunyuan15", "wan21 tp=2", "autoencoder-kl", "flux2",
                                  "qwen-image", "ltx-video", "ltx2"])
def test_what_is_counted_exactly_is_exact(measured, name):
    """Weights, latents (and an LTX decoder's timestep and noise), frames and the caches a step
    donates: what is estimated from the shapes alone, compared with memory_analysis()'s own split
    (to the bytes beside them: the non-finite counts, the output tuple's table, the caches' frame
    counters, the encode's options)."""
    for _, programs in measured(name):
        for program, estimate, memory in programs:
            assert abs(estimate.argument - memory["argument_bytes"]) <= BESIDE, (program, estimate, memory)
            assert abs(estimate.output - memory["output_bytes"]) <= BESIDE, (program, estimate, memory)
            assert abs(estimate.alias - memory["alias_bytes"]) <= BESIDE, (program, estimate, memory)
            # The later step's caches are donated; nothing else is.
            assert (memory["alias_bytes"] > 0) == (program == "next"), (program, memory)
