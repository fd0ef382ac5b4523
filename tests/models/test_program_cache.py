"""The model's program cache (compiled once, least recently used out) and what a compiled program says."""

import re

import numpy as np
import pytest

from vaeserve import models
from vaeserve.models.conv import native_conv_for, rounded_conv_sums_for
from vaeserve.models.estimate import QUERY_CHUNK
from vaeserve.models.programs import ProgramCache, ProgramKey
from vaeserve.sharding.bands import band_layout
from vaeserve.sharding.mesh import mesh_key, single_device_mesh

CONFIG = models.WanVAEConfig(base_dim=8, num_res_blocks=1)
SHAPE = (1, 16, 2, 3, 3)


@pytest.fixture(scope="module")
def vae():
    return models.init_vae(CONFIG, seed=0)


def test_a_shape_compiles_once_and_the_cache_drops_the_least_recently_used(vae):
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    first = np.asarray(vae.decode(x))
    compiles = vae.programs.compiles
    assert np.array_equal(np.asarray(vae.decode(x)), first) and vae.programs.compiles == compiles
    (key,) = vae.programs.keys()  # a named key: what the service lists under /v1/models
    assert isinstance(key, ProgramKey) and key.mesh == mesh_key(single_device_mesh())  # one device: a 1x1 mesh
    assert dict(key.options) == {"denormalize": False, "chunk": 1, "layout": band_layout(3, 3, 1), "query_chunk": QUERY_CHUNK}
    assert key.describe() == ["decode", list(SHAPE), "float"]

    seen = []
    cache = ProgramCache(max_entries=2)
    cache.on_evict = seen.append
    for key in ("a", "b", "a", "c"):  # "a" is used again before "c" arrives, so "b" goes
        cache.get(key, lambda key=key: _Lowered(key))  # bind this iteration's key (B023)
    assert cache.keys() == ["a", "c"] and seen == ["b"]
    assert (cache.compiles, cache.evictions) == (3, 1)
    with pytest.raises(ValueError, match="max_entries"):
        ProgramCache(max_entries=0)


class _Lowered:
    """Stands in for ``jax.stages.Lowered``: the cache's bookkeeping does not depend on XLA."""

    def __init__(self, name):
        self.name = name

    def compile(self):
        return f"compiled {self.name}"


def test_the_profile_names_every_block(vae):
    """``jax.named_scope`` on every layer: a profile (and the HLO) says which conv is which."""
    names = set(re.findall(r'op_name="([^"]+)"', vae.compile(SHAPE).as_text()))
    for path in ("decoder/Decoder3d/up_blocks.1/UpBlock/resnets.0/ResidualBlock/conv1/CausalConv3d",
                 "decoder/Decoder3d/mid_block/MidBlock/attentions.0/FrameAttentionBlock",
                 "decoder/Decoder3d/up_blocks.0/UpBlock/upsamplers.0/Resample/time_conv",
                 "decode_step/WanDecoder/post_quant_conv/PointwiseConv"):
        assert any(path in name for name in names), path


def test_the_conv_path_follows_the_target_platform(vae):
    assert native_conv_for("tpu") and native_conv_for("gpu") and not native_conv_for("cpu")
    # Only cuDNN lacks bfloat16 convolutions with float32 sums.
    assert rounded_conv_sums_for("gpu") and not rounded_conv_sums_for("tpu") and not rounded_conv_sums_for("cpu")
    # On this CPU host the single-device program hands its convolutions to oneDNN (the default);
    # with cpu_convs="matmul" it runs nine-tap matmuls: no convolution ops at all.
    assert "__onednn$convolution" in vae.compile(SHAPE).as_text()
    nine_tap = models.abstract_vae(CONFIG)  # compiled, never run
    nine_tap.cpu_convs = "matmul"
    text = nine_tap.compile(SHAPE).as_text()
    assert " convolution(" not in text and "__onednn$convolution" not in text
