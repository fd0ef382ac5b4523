"""Per-chip memory divides with tp on the TPU compiler, for every family that streams.

libtpu compiles each family's decode for `v6e:2x2` at tp = 1, 2 and 4 (small configs laid out as the
real ones: a temporal upsampler, then full-resolution causal convs run frame by frame in the inner
loop, as a server runs real sizes). Each chip's temp bytes must fall as 1/tp: temp(tp=2) ≤ 0.6 × temp(tp=1) and
temp(tp=4) ≤ 0.35 × temp(tp=1). The negative control, a decode that gathers the whole frame onto
every band (``sharding._controls.compile_whole_frame_decode``), must fail that rule.

Activations outweigh the weights in Wan 2.2's case only: larger frames of the others take minutes
and gigabytes per compile. Where weights dominate, the kernels' copies libtpu keeps in temp
(~5 MB per chip at every tp > 1) set a floor that does not divide; those cases, and Wan 2.2's
tp = 2, are strict xfails with their measured ratios (``SHORT``).
"""

import pytest

import models
import sharding
from sharding._controls import compile_whole_frame_decode
from sharding.chips import topology_devices
from sharding.introspect import program_memory
from tests.sharding.test_tpu_aot import _require_libtpu

TOPOLOGY = "v6e:2x2"
TPS = (1, 2, 4)
# At most these fractions of tp = 1's temp bytes per chip (1/tp, plus room for the halo rows).
RULE = {2: 0.6, 4: 0.35}
# Small configs with the real layout of each family: a temporal upsampler, so the later stage runs
# in the inner frame loop (inner_frames=1: what a server runs at real sizes), full-resolution causal
# convs whose caches cross the steps. Latent heights split evenly over 4.
FAMILIES = {
    "wan2.1": (models.WanVAEConfig(base_dim=64, dim_mult=(1, 2), temperal_downsample=(True,), num_res_blocks=0,
                                   scale_factor_spatial=2, scale_factor_temporal=2), (1, 16, 3, 32, 32)),
    "wan2.2": (models.WanVAEConfig.wan22(base_dim=64, decoder_base_dim=64, dim_mult=(1, 1), temperal_downsample=(True,),
                                         num_res_blocks=0, scale_factor_spatial=4, scale_factor_temporal=2),
               (1, 48, 3, 32, 64)),
    "hunyuan1.5": (models.HunyuanVideo15Config(block_out_channels=(64, 128), layers_per_block=1, latent_channels=16,
                                               spatial_compression_ratio=2, temporal_compression_ratio=2),
                   (1, 16, 3, 32, 32)),
}
# Ten compiles on one core: ~350 s of CPU (9.5 min of wall time on a loaded 2-core host).
pytestmark = pytest.mark.timeout(1800)


def _temp(compiled) -> int:
    return program_memory(compiled)["temp_bytes"]


def assert_temp_divides(temp: dict[int, int]) -> None:
    """``{tp: temp bytes per chip}``: each tp > 1 present within its share of tp = 1's (``RULE``)."""
    for tp, most in RULE.items():
        if tp in temp:
            assert temp[tp] <= most * temp[1], (tp, round(temp[tp] / temp[1], 3), temp)


def _ratios(temp: dict[int, int]) -> str:
    return ", ".join(f"tp={tp}: {temp[tp] / 1e6:.2f} MB ({temp[tp] / temp[1]:.3f})" for tp in sorted(temp))


@pytest.fixture(scope="module")
def devices():
    _require_libtpu()
    return topology_devices(TOPOLOGY)


@pytest.fixture(scope="module")
def vaes():
    return {name: models.abstract_vae(config, dtype="bfloat16") for name, (config, _) in FAMILIES.items()}


@pytest.fixture(scope="module")
def temps(vaes, devices):
    """``{family: {tp: temp bytes per chip}}``, each program compiled once (the program the planner
    compiles: ``compile_decode``, uint8 frames, the inner loop of one frame)."""
    temps = {}
    for name, (_, shape) in FAMILIES.items():
        temps[name] = {tp: _temp(sharding.compile_decode(vaes[name], shape, sharding.make_mesh(tp, devices=devices),
                                                         output="uint8", split="height", inner_frames=1))
                       for tp in TPS}
        print(f"{name} {shape}: {_ratios(temps[name])}")
    return temps


# (family, tp) cases the compiled programs do not meet yet, with the ratio measured (libtpu 0.0.50.1).
# Where weights dominate (kernels libtpu copies into temp: ~5 MB per chip at every tp > 1 here), the
# floor does not divide; where activations dominate, tp = 2 still keeps more than half (the same
# gap as Wan 2.1 at 1280x704: 0.76).
SHORT: dict[tuple[str, int], str] = {
    ("wan2.1", 4): "0.360 of tp=1 (14.38 -> 5.17 MB): the kernels' copies in temp (~5 MB) do not divide",
    ("wan2.2", 2): "0.613 of tp=1 (29.40 -> 18.03 MB): tp=2 keeps more than half of the full-resolution working set",
    ("hunyuan1.5", 2): "0.699 of tp=1 (11.28 -> 7.89 MB): weights (13.5 MB) dominate; their copies in temp do not divide",
    ("hunyuan1.5", 4): "0.682 of tp=1 (11.28 -> 7.69 MB): weights (13.5 MB) dominate; their copies in temp do not divide",
}


def _cases():
    for family in FAMILIES:
        for tp in RULE:
            reason = SHORT.get((family, tp))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(family, tp, marks=marks, id=f"{family}-tp{tp}")


@pytest.mark.parametrize("family, tp", list(_cases()))
def test_temp_per_chip_divides_with_tp(temps, family, tp):
    assert_temp_divides({1: temps[family][1], tp: temps[family][tp]})


def test_a_decode_that_gathers_the_whole_frame_fails_the_rule(temps, vaes, devices):
    """At tp = 4 each chip of the control holds a whole frame's working set: far above 0.35 × tp = 1."""
    _, shape = FAMILIES["wan2.1"]
    gathered = {1: temps["wan2.1"][1],
                4: _temp(compile_whole_frame_decode(vaes["wan2.1"], shape, sharding.make_mesh(4, devices=devices),
                                                    inner_frames=1))}
    print(f"whole-frame control, wan2.1 {shape}: {_ratios(gathered)}")
    assert gathered[4] > 0.8 * gathered[1], gathered
    with pytest.raises(AssertionError):
        assert_temp_divides(gathered)
