"""Frame-level streaming inside each step (``inner_frames``) under ``shard_map``: still exact.

The inner loops run on every band alike, their halos exchanged inside the loop, so the streamed
sharded decode must equal the single-device decode (≤ 1e-5, as every sharded decode) on an uneven
split with a wholly padded band, stream step by step, and keep only one-row halos and the
latent-resolution K/V crossing devices. These frames are small, so the automatic choice would
not stream them: one frame per inner step is asked for explicitly.
"""

import numpy as np

from tests.helpers.sharding_helpers import WIDTH, make_latents
from vaeserve import sharding
from vaeserve.models.decode import to_uint8

TOLERANCE = 1e-5
TP, SHAPE = 4, (1, 3, 5, WIDTH)  # latent height 5 over 4 bands: 2, 2, 1 and 0 real rows (padded)


def test_streamed_sharded_decode_matches_single_device(vae, reference):
    mesh = sharding.make_mesh(TP)
    got = np.asarray(sharding.sharded_decode(vae, make_latents(*SHAPE), mesh, split="height", inner_frames=1))
    assert np.abs(got - reference(SHAPE)).max() <= TOLERANCE
    # The same program's HLO: one-row halo slabs (those inside the inner loops carry one frame) and
    # all-gathers only of the latent-resolution K/V (the host crops the uneven split's padding).
    found = sharding.collectives(sharding.hlo_text(vae, (1, 16, *SHAPE[1:]), mesh, split="height", inner_frames=1))
    halos = [c for c in found if c["op"] == "collective-permute" and c["shape"][2] == 1]  # (B, T, 1, w, C)
    # Frames per slab: 1 (frame 0, the latent-resolution stages, every stage inside the inner loops)
    # or 2 (the upsampler after an inner step's time conv); unstreamed, the last stages carry 4.
    assert {c["shape"][1] for c in halos} == {1, 2}
    for collective in found:
        if collective not in halos:  # K/V: 5 latent rows padded to 8
            assert collective["op"] == "all-gather" and collective["shape"][1:3] == (8, WIDTH), collective


def test_streamed_sharded_steps_concatenate_to_the_decode(vae, reference):
    steps = [step.frames for step in sharding.sharded_decode_stream(vae, make_latents(*SHAPE), sharding.make_mesh(TP),
                                                                    split="height", inner_frames=1)]
    assert [s.shape[1] for s in steps] == [1, 4, 4]
    expected = np.asarray(to_uint8(np.moveaxis(reference(SHAPE), 1, -1)))
    frames = np.concatenate(steps, axis=1)
    assert np.abs(frames.astype(int) - expected).max() <= 1  # ~1e-6 float differences may flip a .5
    assert np.mean(frames == expected) > 0.999
