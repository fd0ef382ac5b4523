"""Temp bytes per chip of small decodes compiled for ``v6e:2x2``, in the regime of real sizes.

At real sizes a band's activations dwarf a TensorCore's vector memory (VMEM: a 1280×704 frame of 96
bfloat16 channels is 173 MB, VMEM about 128 MiB), so a decode's temporaries live in HBM and divide
with the band. A small config's whole working set fits VMEM instead, and what is left in HBM (kernel
copies, a few spilled buffers) says nothing about how the activations divide. Compiled with VMEM
cut to ``VMEM_KIB`` (about one full-resolution frame of these configs), the small decodes keep
their activations in HBM as real ones do.

libtpu reads its VMEM size once, when it loads (``LIBTPU_INIT_ARGS``), so this runs in a process of
its own: ``python -m tests.sharding.tpu_temp`` prints ``{"families": {family: {tp: temp bytes}},
"whole_frame": {tp: temp bytes}}`` as JSON.
"""

from __future__ import annotations

import json

from vaeserve import models

TOPOLOGY = "v6e:2x2"
TPS = (1, 2, 4)
VMEM_KIB = 4096
LIBTPU_ARGS = f"--xla_tpu_override_vmem_size_kib={VMEM_KIB}"
# Small configs with the real layout of each family: a temporal upsampler, so the later stage runs
# in the inner frame loop (inner_frames=1: what a server runs at real sizes), full-resolution causal
# convs whose caches cross the steps. Latent heights split evenly over 4; each full-resolution
# frame is 1–2 MiB, the order of ``VMEM_KIB``.
FAMILIES: dict[str, tuple[models.VAEConfig, tuple[int, ...]]] = {
    "wan2.1": (models.WanVAEConfig(base_dim=64, dim_mult=(1, 2), temperal_downsample=(True,), num_res_blocks=0,
                                   scale_factor_spatial=2, scale_factor_temporal=2), (1, 16, 3, 64, 64)),
    "wan2.2": (models.WanVAEConfig.wan22(base_dim=64, decoder_base_dim=64, dim_mult=(1, 1), temperal_downsample=(True,),
                                         num_res_blocks=0, scale_factor_spatial=4, scale_factor_temporal=2),
               (1, 48, 3, 32, 64)),
    "hunyuan1.5": (models.HunyuanVideo15Config(block_out_channels=(64, 128), layers_per_block=1, latent_channels=16,
                                               spatial_compression_ratio=2, temporal_compression_ratio=2),
                   (1, 16, 3, 64, 64)),
}
# The negative control: the Wan 2.1 decode with every band decoding the whole frame.
CONTROL = ("wan2.1", 4)


def measure() -> dict:
    """Compile every family at every tp (``compile_decode``: the program ``vaeserve plan`` compiles,
    uint8 frames, the inner loop of one frame) and the whole-frame control; their temp bytes."""
    from vaeserve import sharding
    from vaeserve.sharding._controls import compile_whole_frame_decode
    from vaeserve.sharding.chips import topology_devices
    from vaeserve.sharding.introspect import program_memory

    devices = topology_devices(TOPOLOGY)
    vaes = {name: models.abstract_vae(config, dtype="bfloat16") for name, (config, _) in FAMILIES.items()}
    temps = {name: {tp: program_memory(sharding.compile_decode(
        vaes[name], shape, sharding.make_mesh(tp, devices=devices), output="uint8", split="height", inner_frames=1,
    ))["temp_bytes"] for tp in TPS} for name, (_, shape) in FAMILIES.items()}
    family, tp = CONTROL
    control = compile_whole_frame_decode(vaes[family], FAMILIES[family][1], sharding.make_mesh(tp, devices=devices),
                                         inner_frames=1)
    return {"families": temps, "whole_frame": {1: temps[family][1], tp: program_memory(control)["temp_bytes"]}}


if __name__ == "__main__":
    print(json.dumps(measure()))
