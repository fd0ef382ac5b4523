"""An LTX decoder that sees one frame ahead, decoded step by step: exactly the whole-clip decode.

The small LTX-2.3 model (``tests/helpers/ltx_reference.LTX23``) has a look-ahead of 7 latent frames:
a stream's first step takes 8, and a clip of 10 latent frames (73 frames) then needs later steps
that run past the clip's end. The whole decode (a scan of those steps) equals diffusers' decode of
the whole clip, the stream equals the whole decode, the step size does not matter, and the memory
of the decode does not grow with the clip.
"""

import importlib.util

import numpy as np
import pytest

from tests.helpers.ltx_reference import CASES, LTX23, seeded_weights
from tests.helpers.wan_reference import seeded_latents, write_diffusers_folder
from vaeserve import models
from vaeserve.models.decode import stream_frames, stream_steps
from vaeserve.models.families.ltx.layers import emitted
from vaeserve.models.programs import ProgramKey
from vaeserve.sharding.introspect import program_memory

TOLERANCE = 2e-5
SHAPE = (1, 8, 10, 2, 1)  # 10 latent frames: the first step (8) and two more, the last past the end
has_diffusers = importlib.util.find_spec("diffusers") is not None


def _max_diff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


@pytest.fixture(scope="module")
def vae(tmp_path_factory):
    seed = CASES["ltx23"][1]
    return models.load_vae(write_diffusers_folder(tmp_path_factory.mktemp("ltx23"), LTX23, seeded_weights(LTX23, seed)))


@pytest.fixture(scope="module")
def latents():
    return seeded_latents(SHAPE, 77)


@pytest.fixture(scope="module")
def whole(vae, latents):
    return np.asarray(vae.decode(latents))


def test_the_steps_of_a_stream():
    """Pure arithmetic: the first step takes 1 + lookahead latent frames and gives its frames behind
    them; later steps take one latent frame each and give 8 frames, until all 73 are out."""
    assert LTX23.lookahead == 7 and LTX23.first_step_frames(8) == 1
    steps = stream_steps(SHAPE[2], 1, LTX23)
    assert steps == [(0, 8)] + [(8 + i, 9 + i) for i in range(9)]
    frames = stream_frames(LTX23, SHAPE[2], 1)
    assert frames[0] == (0, 1) and frames[-1] == (65, 73) and all(b - a == 8 for a, b in frames[1:])
    assert stream_steps(3, 1, LTX23) == [(0, 8), (8, 9), (9, 10)]  # a short clip: the steps run past its end


def test_convs_compute_only_the_clips_frames():
    """Pure arithmetic: a conv's output frame ``j`` is clip frame ``first_index + 1 + j``; the frames
    past the clip's end are not computed (nothing reads them). The first step of a 3-latent-frame
    clip: 3 of 22 at latent rate, 17 of 17 at full rate; a later step wholly past the end: none."""
    assert emitted(22, first_index=-1, end=3) == 3
    assert emitted(14, first_index=-1, end=17) == 14
    assert emitted(8, first_index=13, end=17) == 3
    assert emitted(8, first_index=21, end=17) == 0


@pytest.mark.skipif(not has_diffusers, reason="needs diffusers + torch")
def test_long_clip_matches_diffusers(whole, latents):
    """A clip longer than the first step: later steps and the clip's end (a copy of the last frame
    at every conv) match diffusers' decode of the whole clip."""
    from tests.helpers.ltx_reference import reference_decode, reference_model

    reference = reference_model(LTX23, seeded_weights(LTX23, CASES["ltx23"][1]))
    expected = np.clip(reference_decode(reference, LTX23, latents), -1, 1)
    assert whole.shape == (1, 3, 73, 32, 16)
    assert _max_diff(whole, expected) <= TOLERANCE


def test_stream_concatenates_to_the_whole_decode(vae, latents, whole):
    pieces = list(vae.decode_stream(latents))
    assert [p.shape[1] for p in pieces] == [b - a for a, b in stream_frames(LTX23, SHAPE[2], 1)]
    expected = np.round((np.moveaxis(whole, 1, -1) + 1) * 127.5)
    streamed = np.concatenate(pieces, axis=1).astype(np.float64)
    assert _max_diff(streamed, expected) <= 1 and np.mean(streamed == expected) > 0.999  # a .5 may round either way


def test_steps_of_two_latent_frames_give_the_same_frames(vae, latents, whole):
    assert _max_diff(np.asarray(vae.decode(latents, chunk=2)), whole) <= 1e-5


def test_memory_stays_flat_in_the_clip_length(vae, whole):
    """Three times the latent frames: three times the output, the same working memory (one step's
    activations and caches). The same clip decoded as one step (every conv over the whole clip at
    once) held 13x more here (15.3 MB against 1.19 MB)."""
    short = program_memory(vae.compile(SHAPE))
    long = program_memory(vae.compile((*SHAPE[:2], 30, *SHAPE[3:])))
    assert long["output_bytes"] > 2.5 * short["output_bytes"]
    assert long["temp_bytes"] <= 1.05 * short["temp_bytes"]


def first_step_keys(vae) -> list:
    return [key for key in vae.programs.keys() if isinstance(key, ProgramKey) and key.program == "stream-step"
            and key.variant == "first"]


def test_clips_up_to_a_bucket_share_one_first_step(vae, latents):
    """The first step takes the clip's length at run time: streams of 2, 3 and 4 latent frames (one
    first-step shape) compile it once, each still the whole decode of its own clip (what comes past
    its end differs); a clip of 5 rounds up to the next bucket, the first step's reach (8), which every
    longer clip shares (the control: a new program, said so in its label)."""
    before = set(first_step_keys(vae))
    for frames in (2, 3, 4):
        clip = latents[:, :, :frames]
        streamed = np.concatenate(list(vae.decode_stream(clip)), axis=1).astype(np.float64)
        expected = np.round((np.moveaxis(np.asarray(vae.decode(clip)), 1, -1) + 1) * 127.5)
        assert streamed.shape[1] == 1 + 8 * (frames - 1)
        assert _max_diff(streamed, expected) <= 1 and np.mean(streamed == expected) > 0.999
    (new,) = set(first_step_keys(vae)) - before
    assert new.describe()[2] == "first+clips<=4"
    list(vae.decode_stream(latents[:, :, :5]))
    list(vae.decode_stream(latents))  # 10 latent frames: past the reach, the same program as 5
    labels = [key.describe()[2] for key in first_step_keys(vae)]
    assert sorted(labels) == ["first+clips<=4", "first+clips<=8"]
