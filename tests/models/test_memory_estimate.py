"""The estimate a server refuses hopeless requests with (``models.memory``), against the compiled
programs' ``memory_analysis()``: every family, the programs a server runs (each decode step, a
whole-clip decode, an encode), several shapes each, tp = 1 and 2.

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

import models
import sharding
from models.memory import estimator
from sharding.fits import program_total_bytes
from sharding.introspect import program_memory
from tests.helpers.hunyuan_reference import HY10_TINY, HY15_TINY

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
}


def cases(name: str, tp: int = 1, *, shapes: int = 2, encode: bool = True):
    """``(shape, [(estimate, memory_analysis())] per program)``: the server's decode steps of each
    shape (first and later step, or the whole clip), then the encode."""
    config, decodes, encodes = FAMILIES[name]
    vae = models.init_vae(config)
    mesh = sharding.make_mesh(tp)
    model = estimator(config, dtype="float32", decoder_parameters=vae.metadata["parameters"],
                      encoder_parameters=vae.metadata["encoder_parameters"], tp=tp)
    assert model is not None
    for shape in decodes[:shapes]:
        compiled = sharding.compile_decode_stream(vae, shape, mesh)
        estimates = [program.estimate for program in model.decode_steps(shape)]
        assert len(estimates) == len(compiled)
        yield shape, list(zip(estimates, map(program_memory, compiled), strict=True))
    for shape in encodes if encode else ():
        yield shape, [(model.encode(shape), program_memory(sharding.compile_encode(vae, shape, mesh)))]


@pytest.fixture(scope="module")
def measured() -> dict:
    found = {name: list(cases(name)) for name in FAMILIES}
    found["wan21 tp=2"] = list(cases("wan21", tp=2, shapes=1, encode=False))
    return found


@pytest.mark.parametrize("name", [*FAMILIES, "wan21 tp=2"])
def test_the_estimate_is_within_bounds_of_memory_analysis(measured, name):
    ratios = {(shape, index): estimate.total / program_total_bytes(memory)
              for shape, programs in measured[name] for index, (estimate, memory) in enumerate(programs)}
    assert all(LOW <= r <= HIGH for r in ratios.values()), ratios
    # Negative control: without the working memory the same comparison fails.
    forgetful = [dataclasses.replace(estimate, temp=0).total / program_total_bytes(memory)
                 for _, programs in measured[name] for estimate, memory in programs]
    assert min(forgetful) < LOW, forgetful


@pytest.mark.parametrize("name", ["wan21", "wan22", "hunyuan15", "wan21 tp=2"])
def test_what_is_counted_exactly_is_exact(measured, name):
    """Weights, latents, frames and the caches a step donates: what a causal model's steps are
    estimated to take from the shapes alone, compared with memory_analysis()'s own split (to the
    bytes beside them: the non-finite counts, the output tuple's table, HunyuanVideo 1.5's frame
    counter)."""
    decodes = measured[name][:-1] if name in FAMILIES else measured[name]  # the last is the encode
    for _, (first, later) in decodes:
        for estimate, memory in (first, later):
            assert abs(estimate.argument - memory["argument_bytes"]) <= BESIDE, (estimate, memory)
            assert abs(estimate.output - memory["output_bytes"]) <= BESIDE, (estimate, memory)
        assert abs(later[0].alias - later[1]["alias_bytes"]) <= BESIDE  # the later step's caches, donated
        assert later[1]["alias_bytes"] > 0 == first[1]["alias_bytes"]
