"""MiniMax-H3's audio VAE against diffusers' (float32): the decoder (latents → waveform) and the
encoder (waveform → the posterior's mean) of ``AutoencoderKLMiniMaxH3Audio``, and the pipeline's
decode and encode (normalised stereo latents ↔ a stereo waveform), on a tiny random config, loaded
from a ``save_pretrained`` folder.

The promise is ≤ 1e-4 max abs; each comparison has a negative control that must exceed it: one
tap of a low-pass filter moved, one Snake ``alpha`` moved, the latents left normalised, the
upsampler's phases swapped. Live against diffusers (skipped without torch); each test compiles one
or two tiny programs (2-4 s on 2 shared cores; the file ~36 s with its imports).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from diffusers import AutoencoderKLMiniMaxH3Audio  # noqa: E402
from flax import nnx  # noqa: E402

from vaeserve.models.families.ltx2_audio.weights import load_module  # noqa: E402
from vaeserve.models.families.minimax_h3_audio.config import MiniMaxH3AudioConfig  # noqa: E402
from vaeserve.models.families.minimax_h3_audio.modules import (  # noqa: E402
    H3AudioDecoder,
    H3AudioEncoder,
    decimate_lowpass,
    kaiser_sinc_taps,
    upsample_polyphase,
)
from vaeserve.models.families.minimax_h3_audio.pipeline import (  # noqa: E402
    H3AudioDecodePath,
    H3AudioStatistics,
    decode_audio,
    encode_audio,
    load_h3_audio_decode_path,
    load_h3_audio_encode_path,
)
from vaeserve.models.families.minimax_h3_audio.weights import (  # noqa: E402
    DECODER_PREFIXES,
    ENCODER_PREFIXES,
    load_h3_audio_decoder,
    load_h3_audio_encoder,
    seeded_h3_audio,
    tensors_under,
)
from vaeserve.models.loading import WeightsError  # noqa: E402

TOLERANCE = 1e-4
LATENT_CHANNELS = 8
# Hop 10 (an odd stride: DAC's ceil(stride/2) padding); heads 12 wide pooled to 8 latent channels
# (overlapping adaptive-pool windows); two upsamplers, two AMP blocks each.
CONFIG = dict(encoder_dim=4, encoder_rates=(2, 5), latent_dim=24, latent_channels=LATENT_CHANNELS,
              num_attention_heads=2, decoder_dim=16, decoder_rates=(5, 2), decoder_kernel_sizes=(9, 4),
              resblock_kernel_sizes=(3, 5), resblock_dilation_sizes=((1, 3), (1, 2)), sampling_rate=100,
              latents_mean=[0.1 * i - 0.3 for i in range(LATENT_CHANNELS)],
              latents_std=[0.5 + 0.1 * i for i in range(LATENT_CHANNELS)])
LATENT_FRAMES, HOP = 6, 10


def _max_diff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def _jitted(module, x):
    return np.asarray(jax.jit(lambda m, v: m(v))(module, jnp.asarray(x)))


def _state(model) -> dict[str, np.ndarray]:
    return {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}


@pytest.fixture(scope="module")
def pipeline_folder(tmp_path_factory):
    """A pipeline folder's ``audio_vae/`` and the torch model: diffusers' initial weights, each
    parameter moved by seeded noise (SnakeBeta's log-scale parameters start at 0), small enough that
    the clip to [-1, 1] leaves most samples alone."""
    torch.manual_seed(0)
    vae = AutoencoderKLMiniMaxH3Audio(**CONFIG).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in vae.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    root = tmp_path_factory.mktemp("h3_pipeline")
    vae.save_pretrained(root / "audio_vae")
    return root, vae


def _latents(seed: int):
    return torch.randn(2, LATENT_CHANNELS, LATENT_FRAMES, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("ratio", "kernel", "samples"), [(2, 12, 9), (3, 13, 10), (2, 11, 8)])
def test_resampling_matches_diffusers(ratio, kernel, samples):
    """About a second each (op by op, no jit). The anti-aliased activations' resamplers, computed by
    phases and strided slices, against diffusers' (a depthwise transposed conv, a strided one) at
    the release's ratio and kernel and at others; the control: the phases swapped."""
    from diffusers.models.autoencoders.autoencoder_kl_minimax_h3_audio import (
        MiniMaxH3AudioDownSample1d,
        MiniMaxH3AudioUpSample1d,
    )

    up, down = MiniMaxH3AudioUpSample1d(ratio, kernel), MiniMaxH3AudioDownSample1d(ratio, kernel)
    x = torch.randn(2, 3, samples, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        expected_up, expected_down = up(x).numpy(), down(x).numpy()
    taps = jnp.asarray(up.filter.numpy().reshape(-1))
    # Our own taps (seeded random weights) are the checkpoint's, to float32's rounding.
    np.testing.assert_allclose(kaiser_sinc_taps(0.5 / ratio, 0.6 / ratio, kernel).reshape(-1), taps, atol=1e-7)
    channels_last = jnp.asarray(x.numpy().transpose(0, 2, 1))
    upsampled = np.asarray(upsample_polyphase(channels_last, taps, ratio)).transpose(0, 2, 1)
    assert _max_diff(upsampled, expected_up) <= 1e-6
    assert _max_diff(np.asarray(decimate_lowpass(channels_last, taps, ratio)).transpose(0, 2, 1), expected_down) <= 1e-6
    swapped = upsampled.reshape(2, 3, samples, ratio)[..., ::-1].reshape(upsampled.shape)
    assert _max_diff(swapped, expected_up) > 10 * TOLERANCE


def test_decoder_matches_diffusers(pipeline_folder):
    """~4 s. Denormalised latents → waveform, the decoder read from the folder's ``audio_vae/``; the
    control: one tap of one anti-aliasing low-pass filter moved."""
    root, vae = pipeline_folder
    decoder = load_h3_audio_decoder(root / "audio_vae")
    latents = _latents(2)
    with torch.no_grad():
        expected = vae.decode(latents).sample.numpy()
    assert expected.shape == (2, 1, LATENT_FRAMES * HOP) and (np.abs(expected) < 1).mean() > 0.9
    assert _max_diff(_jitted(decoder, latents.numpy()), expected) <= TOLERANCE

    tensors = tensors_under(_state(vae), DECODER_PREFIXES)
    tensors["decoder.resblocks.1.activations.2.downsample.lowpass.filter"][0, 0, 5] += 0.05
    control = load_module(lambda: H3AudioDecoder(decoder.config), tensors)
    assert _max_diff(_jitted(control, latents.numpy()), expected) > 10 * TOLERANCE


def test_encoder_matches_diffusers(pipeline_folder):
    """~3 s. A waveform of a length that is no whole number of hops (right-padded to one) → the
    posterior's mean (``latent_dist.mode()``); the control: one DAC Snake ``alpha`` moved."""
    root, vae = pipeline_folder
    encoder = load_h3_audio_encoder(root)
    waveform = 0.5 * torch.randn(2, 1, LATENT_FRAMES * HOP - 3, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = vae.encode(waveform).latent_dist.mode().numpy()
    assert expected.shape == (2, LATENT_CHANNELS, LATENT_FRAMES)
    assert _max_diff(_jitted(encoder, waveform.numpy()), expected) <= TOLERANCE

    tensors = tensors_under(_state(vae), ENCODER_PREFIXES)
    tensors["encoder.block.2.block.1.block.2.alpha"][0, 3, 0] += 0.1
    control = load_module(lambda: H3AudioEncoder(encoder.config), tensors)
    assert _max_diff(_jitted(control, waveform.numpy()), expected) > 10 * TOLERANCE


def _pipeline_decode(vae, latents) -> np.ndarray:
    """``MiniMaxH3AudioDecodeStep.__call__``'s arithmetic."""
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1)
    with torch.no_grad():
        audio = vae.decode(latents * std + mean, return_dict=False)[0]
    return audio.float().permute(1, 0, 2).numpy()


def test_decode_audio_matches_the_pipeline(pipeline_folder):
    """~3 s. Normalised stereo latents ``(2, C, L)`` → the waveform ``(1, 2, S)``, from the pipeline
    folder; the control: the statistics left out (the latents decoded as if denormalised)."""
    root, vae = pipeline_folder
    path = load_h3_audio_decode_path(root)
    latents = _latents(4)
    expected = _pipeline_decode(vae, latents)
    assert expected.shape == (1, 2, LATENT_FRAMES * HOP)
    decode = jax.jit(decode_audio)
    assert _max_diff(decode(path, jnp.asarray(latents.numpy())), expected) <= TOLERANCE

    identity = H3AudioStatistics(np.zeros(LATENT_CHANNELS, np.float32), np.ones(LATENT_CHANNELS, np.float32))
    control = H3AudioDecodePath(path.decoder, identity)
    assert _max_diff(decode(control, jnp.asarray(latents.numpy())), expected) > TOLERANCE


def test_encode_audio_matches_the_pipeline(pipeline_folder):
    """~2 s. A stereo soundtrack ``(2, S)`` → normalised latents ``(2, C, L)`` as the pipeline's
    reference encoder computes them (before it packs them into rows)."""
    root, vae = pipeline_folder
    path = load_h3_audio_encode_path(root)
    soundtrack = 0.5 * torch.randn(2, LATENT_FRAMES * HOP, generator=torch.Generator().manual_seed(5))
    mean = torch.tensor(vae.config.latents_mean).view(1, 1, -1)
    std = torch.tensor(vae.config.latents_std).view(1, 1, -1)
    with torch.no_grad():
        latents = vae.encode(soundtrack[:, None], return_dict=False)[0].mode().float().transpose(1, 2)
    expected = ((latents - mean) / std).transpose(1, 2).numpy()
    assert _max_diff(jax.jit(encode_audio)(path, jnp.asarray(soundtrack.numpy())), expected) <= TOLERANCE


def test_bfloat16_decode_follows_float32(pipeline_folder):
    """~3 s. The bfloat16 option: the same decode within bfloat16's precision of float32's."""
    root, _ = pipeline_folder
    latents = jnp.asarray(_latents(6).numpy())
    exact = np.asarray(jax.jit(decode_audio)(load_h3_audio_decode_path(root), latents))
    halved = np.asarray(jax.jit(decode_audio)(load_h3_audio_decode_path(root, dtype="bfloat16"), latents))
    assert halved.dtype == np.float32 and _max_diff(halved, exact) <= 0.05 * np.abs(exact).max()


def _names_and_shapes(build) -> dict[str, tuple[int, ...]]:
    _, state = nnx.split(nnx.eval_shape(build))
    return {".".join(str(p) for p in path): tuple(var.shape) for path, var in nnx.to_flat_state(state)}


def test_release_architecture_names_every_tensor_as_diffusers():
    """~2 s, no compile. The default config (the release's) has exactly diffusers' tensors, names
    and shapes, less ``logs_proj`` (diffusers' model built on the meta device: no weights drawn)."""
    with torch.device("meta"):
        reference = AutoencoderKLMiniMaxH3Audio()
    expected = {k: tuple(t.shape) for k, t in reference.state_dict().items() if not k.startswith("logs_proj.")}
    config = MiniMaxH3AudioConfig()
    assert {**_names_and_shapes(lambda: H3AudioDecoder(config)),
            **_names_and_shapes(lambda: H3AudioEncoder(config))} == expected
    assert config.hop_length * 40 == config.sampling_rate


def test_seeded_random_weights_decode_and_encode():
    """~4 s. The seeded random model (tiny config) is deterministic, decodes to a waveform in
    [-1, 1] that is no constant, and encodes its shape back; another seed gives another waveform."""
    config = MiniMaxH3AudioConfig(**CONFIG)
    latents = jnp.asarray(_latents(7).numpy())
    decoder, encoder = seeded_h3_audio(config, seed=3)
    run = jax.jit(lambda m, v: m(v))
    waveform = np.asarray(run(decoder, latents))
    assert waveform.shape == (2, 1, LATENT_FRAMES * HOP) and np.abs(waveform).max() <= 1 and waveform.std() > 0
    assert _max_diff(run(seeded_h3_audio(config, seed=3)[0], latents), waveform) == 0
    assert _max_diff(run(seeded_h3_audio(config, seed=4)[0], latents), waveform) > TOLERANCE
    assert run(encoder, jnp.asarray(waveform)).shape == (2, LATENT_CHANNELS, LATENT_FRAMES)


def test_loading_reports_every_problem(pipeline_folder):
    """Instant (no compile). Tensors with one missing, one extra and one mis-shaped are refused
    naming all three; the config round-trips through ``config.json``."""
    _, vae = pipeline_folder
    tensors = tensors_under(_state(vae), DECODER_PREFIXES)
    tensors.pop("decoder.conv_post.weight_g")
    tensors["decoder.extra"] = np.zeros(1, np.float32)
    tensors["dec_in_proj.weight"] = np.zeros((1, 1, 1), np.float32)
    config = MiniMaxH3AudioConfig(**CONFIG)
    with pytest.raises(WeightsError) as error:
        load_module(lambda: H3AudioDecoder(config), tensors)
    assert error.value.missing == ["decoder.conv_post.weight_g"]
    assert error.value.unexpected == ["decoder.extra"]
    assert [m.split(":")[0] for m in error.value.misshaped] == ["dec_in_proj.weight"]
    assert MiniMaxH3AudioConfig.from_dict(dict(vae.config)) == config
    assert MiniMaxH3AudioConfig.from_dict(config.to_dict()) == config
