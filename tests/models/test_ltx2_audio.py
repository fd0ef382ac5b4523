"""Float32 parity with diffusers for LTX-2's sound (``models/families/ltx2_audio/``): the audio VAE's
decoder and encoder (``AutoencoderKLLTX2Audio``), the vocoders (``LTX2Vocoder``, leaky-ReLU as
LTX-2.0's and anti-aliased SnakeBeta; ``LTX2VocoderWithBWE``), and the whole decode as ``LTX2Pipeline``
composes it (denormalise, unpack, decode, vocode), on tiny random configs, loaded from
``save_pretrained`` folders.

The promise is ≤ 1e-4 max abs; each comparison has a negative control that must exceed it: a
decoder or encoder whose convs are not causal, one weight moved, a sinc filter moved, a mel
filterbank moved, latents left normalised. Live against diffusers (skipped without torch); each test compiles one tiny program
(about a second or two on 2 cores).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from diffusers import AutoencoderKLLTX2Audio  # noqa: E402
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, LTX2VocoderWithBWE  # noqa: E402

from vaeserve.models.families.ltx2_audio.config import (  # noqa: E402
    LTX2AudioVAEConfig,
    LTX2VocoderConfig,
    LTX2VocoderWithBWEConfig,
)
from vaeserve.models.families.ltx2_audio.modules import AudioDecoder, AudioEncoder  # noqa: E402
from vaeserve.models.families.ltx2_audio.pipeline import (  # noqa: E402
    AudioDecodePath,
    decode_audio,
    load_audio_decode_path,
)
from vaeserve.models.families.ltx2_audio.vocoder import Vocoder, VocoderWithBWE  # noqa: E402
from vaeserve.models.families.ltx2_audio.weights import (  # noqa: E402
    AudioStatistics,
    load_audio_decoder,
    load_audio_encoder,
    load_module,
    load_vocoder,
)
from vaeserve.models.loading import WeightsError  # noqa: E402

TOLERANCE = 1e-4
# Packed latent features C·M = 2 x (16 / 4) = 8 = base_channels: the statistics' size, as in the
# release (8 x 16 = 128). Three levels (4x in time and bins, as the release), attention in the mid
# block and at the outer level.
VAE_CONFIG = dict(base_channels=8, ch_mult=(1, 2, 2), num_res_blocks=1, latent_channels=2, mel_bins=16,
                  resolution=32, attn_resolutions=(32,), mid_block_add_attention=True)
# Mel features in: 2 channels x 16 bins. 4 samples per mel frame.
VOCODER_CONFIG = dict(in_channels=32, hidden_channels=32, upsample_kernel_sizes=(4, 4), upsample_factors=(2, 2),
                      resnet_kernel_sizes=(3, 5), resnet_dilations=((1, 3), (1, 2)))
VOCODERS = {"leaky_relu": {},
            "snakebeta_antialias": dict(act_fn="snakebeta", antialias=True, final_act_fn=None, final_bias=False)}
# The band-width extension: 4 samples per mel frame at rate 8, then 3x to rate 24 through a log-mel
# spectrogram of 8 mels with a hop of 3 (so the 28 samples of 7 frames are padded to whole hops).
BWE_CONFIG = dict(VOCODER_CONFIG, act_fn="snakebeta", antialias=True, final_act_fn=None, final_bias=False,
                  bwe_in_channels=16, bwe_hidden_channels=16, bwe_upsample_kernel_sizes=(5, 5),
                  bwe_upsample_factors=(3, 3), bwe_resnet_kernel_sizes=(3,), bwe_resnet_dilations=((1, 2),),
                  filter_length=16, hop_length=3, window_length=16, num_mel_channels=8, input_sampling_rate=8,
                  output_sampling_rate=24)
LATENT_FRAMES = 5


def _max_diff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def _jitted(module, x):
    return np.asarray(jax.jit(lambda m, v: m(v))(module, jnp.asarray(x)))


def _perturbed(model, scale: float = 0.1):
    """Random non-trivial values everywhere (SnakeBeta's log-scale parameters start at 0), seeded."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return model.eval()


def _state(model) -> dict[str, np.ndarray]:
    return {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}


@pytest.fixture(scope="module")
def pipeline_folder(tmp_path_factory):
    """A pipeline folder's ``audio_vae/`` and ``vocoder/`` (the leaky-ReLU vocoder), and the torch models."""
    torch.manual_seed(0)
    vae = AutoencoderKLLTX2Audio(**VAE_CONFIG).eval()
    generator = torch.Generator().manual_seed(2)
    vae.latents_mean.copy_(torch.randn(vae.latents_mean.shape, generator=generator))
    vae.latents_std.copy_(0.5 + torch.rand(vae.latents_std.shape, generator=generator))
    vocoder = _perturbed(LTX2Vocoder(**VOCODER_CONFIG))
    root = tmp_path_factory.mktemp("ltx2_pipeline")
    vae.save_pretrained(root / "audio_vae")
    vocoder.save_pretrained(root / "vocoder")
    return root, vae, vocoder


def test_decoder_matches_diffusers(pipeline_folder):
    """~2 s. The decoder from the folder's ``audio_vae/``; the control: the same weights in a decoder
    whose convs are centred (``causality_axis="none"``: no causal pad, no first row dropped)."""
    root, vae, _ = pipeline_folder
    decoder, _ = load_audio_decoder(root / "audio_vae")
    latents = torch.randn(1, 2, LATENT_FRAMES, 4, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = vae.decode(latents).sample.numpy()
    assert expected.shape == (1, 2, 4 * LATENT_FRAMES - 3, 16)
    assert _max_diff(_jitted(decoder, latents.numpy()), expected) <= TOLERANCE

    acausal = dataclasses.replace(decoder.config, causality_axis="none")
    control = load_module(lambda: AudioDecoder(acausal), _state(vae), prefix="decoder.")
    assert _max_diff(_jitted(control, latents.numpy()), expected) > 100 * TOLERANCE


def test_encoder_matches_diffusers(pipeline_folder):
    """~2 s. The posterior's mean (``latent_dist.mode()``) of ``4L − 3`` mel frames is ``L`` latent
    frames; the control: the downsamplers padded as if not causal (``causality_axis="none"``)."""
    root, vae, _ = pipeline_folder
    encoder = load_audio_encoder(root)
    mel = torch.randn(1, 2, 4 * LATENT_FRAMES - 3, 16, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        expected = vae.encode(mel).latent_dist.mode().numpy()
    assert expected.shape == (1, 2, LATENT_FRAMES, 4)
    assert _max_diff(_jitted(encoder, mel.numpy()), expected) <= TOLERANCE

    acausal = dataclasses.replace(encoder.config, causality_axis="none")
    control = load_module(lambda: AudioEncoder(acausal), _state(vae), prefix="encoder.")
    shifted = _jitted(control, mel.numpy())  # 4 latent frames (the zeros after): compare those
    assert _max_diff(shifted, expected[:, :, :shifted.shape[2]]) > 100 * TOLERANCE


@pytest.mark.parametrize("name", list(VOCODERS))
def test_vocoder_matches_diffusers(name, tmp_path):
    """~2 s each. The control: one tap of a sinc filter (anti-aliased) or one conv weight moved."""
    torch.manual_seed(4)
    reference = _perturbed(LTX2Vocoder(**VOCODER_CONFIG, **VOCODERS[name]))
    reference.save_pretrained(tmp_path)
    vocoder = load_vocoder(tmp_path)
    mel = torch.randn(2, 2, 7, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = reference(mel).numpy()
    assert expected.shape == (2, 2, 7 * 4)
    assert _max_diff(_jitted(vocoder, mel.numpy()), expected) <= TOLERANCE

    tensors = _state(reference)
    moved = "resnets.0.acts1.0.upsample.filter" if "antialias" in name else "resnets.1.convs2.1.weight"
    tensors[moved].reshape(-1)[0] += 0.05
    control = load_module(lambda: Vocoder(LTX2VocoderConfig(**VOCODER_CONFIG, **VOCODERS[name])), tensors)
    assert _max_diff(_jitted(control, mel.numpy()), expected) > TOLERANCE


# diffusers reads ``self.hop_length`` (a config key) when it pads to whole hops, and warns.
@pytest.mark.filterwarnings("ignore:Accessing config attribute:FutureWarning")
def test_vocoder_with_bwe_matches_diffusers(tmp_path):
    """~3 s. ``LTX2VocoderWithBWE`` with random STFT and mel bases (buffers of the checkpoint),
    small weights so that the clip to [-1, 1] leaves most samples alone; the control: one value
    of the mel filterbank moved."""
    torch.manual_seed(9)
    reference = _perturbed(LTX2VocoderWithBWE(**BWE_CONFIG), scale=0.02)
    generator = torch.Generator().manual_seed(10)
    with torch.no_grad():
        basis = reference.mel_stft.stft_fn.forward_basis
        basis.copy_(torch.randn(basis.shape, generator=generator))
        reference.mel_stft.mel_basis.copy_(torch.rand(reference.mel_stft.mel_basis.shape, generator=generator))
    reference.save_pretrained(tmp_path)
    vocoder = load_vocoder(tmp_path)
    assert isinstance(vocoder, VocoderWithBWE)
    mel = torch.randn(1, 2, 7, 16, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        expected = reference(mel).numpy()
    assert expected.shape == (1, 2, 7 * 4 * 3) and (np.abs(expected) < 1).mean() > 0.9
    assert _max_diff(_jitted(vocoder, mel.numpy()), expected) <= TOLERANCE

    tensors = _state(reference)
    tensors["mel_stft.mel_basis"][0, 0] += 0.5
    control = load_module(lambda: VocoderWithBWE(LTX2VocoderWithBWEConfig(**BWE_CONFIG)), tensors)
    assert _max_diff(_jitted(control, mel.numpy()), expected) > TOLERANCE


def _pipeline_methods(*names: str) -> dict:
    """``LTX2Pipeline``'s static methods, read from diffusers' ``pipeline_ltx2.py`` itself: importing
    the pipeline needs ``transformers``, its latent arithmetic needs only torch."""
    source = Path(diffusers.__file__).parent / "pipelines" / "ltx2" / "pipeline_ltx2.py"
    found = {node.name: node for node in ast.walk(ast.parse(source.read_text()))
             if isinstance(node, ast.FunctionDef) and node.name in names}
    module = ast.Module(body=[found[n] for n in names], type_ignores=[])
    namespace: dict = {"torch": torch}
    exec(compile(ast.fix_missing_locations(module), str(source), "exec"), namespace)  # noqa: S102
    return {name: namespace[name] for name in names}


PIPELINE = _pipeline_methods("_denormalize_audio_latents", "_unpack_audio_latents")


def _pipeline_reference(vae, vocoder, packed) -> np.ndarray:
    """``LTX2Pipeline.__call__``'s last steps, with its own static methods."""
    latent_mel_bins = vae.config.mel_bins // vae.mel_compression_ratio
    latents = PIPELINE["_denormalize_audio_latents"](packed, vae.latents_mean, vae.latents_std)
    latents = PIPELINE["_unpack_audio_latents"](latents, packed.shape[1], num_mel_bins=latent_mel_bins)
    with torch.no_grad():
        return vocoder(vae.decode(latents, return_dict=False)[0]).numpy()


def test_decode_audio_matches_the_pipeline(pipeline_folder):
    """~3 s. Packed normalised latents ``(B, L, C·M)`` → waveform, from the pipeline folder; the
    unpacked layout ``output_type="latent"`` returns gives the same; the control: the statistics
    left out (the latents decoded as if denormalised)."""
    root, vae, vocoder = pipeline_folder
    path = load_audio_decode_path(root)
    packed = torch.randn(1, LATENT_FRAMES, 8, generator=torch.Generator().manual_seed(6))
    expected = _pipeline_reference(vae, vocoder, packed)
    assert expected.shape == (1, 2, (4 * LATENT_FRAMES - 3) * 4)
    decode = jax.jit(decode_audio)
    assert _max_diff(decode(path, jnp.asarray(packed.numpy())), expected) <= TOLERANCE

    unpacked = PIPELINE["_unpack_audio_latents"](
        PIPELINE["_denormalize_audio_latents"](packed, vae.latents_mean, vae.latents_std), LATENT_FRAMES, num_mel_bins=4)
    assert _max_diff(jax.jit(decode_audio)(path, jnp.asarray(unpacked.numpy())), expected) <= TOLERANCE

    identity = AudioStatistics(np.zeros(8, np.float32), np.ones(8, np.float32))
    control = AudioDecodePath(path.decoder, identity, path.vocoder)
    assert _max_diff(decode(control, jnp.asarray(packed.numpy())), expected) > TOLERANCE


def test_bfloat16_decode_follows_float32(pipeline_folder):
    """~3 s. The bfloat16 option: the same decode within bfloat16's precision of float32's."""
    root, _, _ = pipeline_folder
    packed = jnp.asarray(np.random.default_rng(7).standard_normal((1, LATENT_FRAMES, 8), np.float32))
    exact = np.asarray(jax.jit(decode_audio)(load_audio_decode_path(root), packed))
    halved = np.asarray(jax.jit(decode_audio)(load_audio_decode_path(root, dtype="bfloat16"), packed), np.float32)
    assert halved.dtype == np.float32 and _max_diff(halved, exact) <= 0.05 * np.abs(exact).max()


def _names_and_shapes(build, prefix: str = "") -> dict[str, tuple[int, ...]]:
    _, state = nnx.split(nnx.eval_shape(build))
    return {prefix + ".".join(str(p) for p in path): tuple(var.shape) for path, var in nnx.to_flat_state(state)}


def test_release_architectures_name_every_tensor_as_diffusers():
    """~3 s, no compile. The default configs (LTX-2's audio VAE, LTX-2.0's vocoder, LTX-2.3's BWE
    vocoder) have exactly diffusers' tensors, names and shapes (diffusers' models built on the
    meta device: no weights drawn)."""
    with torch.device("meta"):
        references = {"vae": AutoencoderKLLTX2Audio(), "vocoder": LTX2Vocoder(), "bwe": LTX2VocoderWithBWE()}
    shapes = {name: {k: tuple(t.shape) for k, t in model.state_dict().items()} for name, model in references.items()}
    config = LTX2AudioVAEConfig()
    ours = {**_names_and_shapes(lambda: AudioDecoder(config), "decoder."),
            **_names_and_shapes(lambda: AudioEncoder(config), "encoder."),
            "latents_mean": (config.base_channels,), "latents_std": (config.base_channels,)}
    assert ours == shapes["vae"]
    assert _names_and_shapes(lambda: Vocoder(LTX2VocoderConfig())) == shapes["vocoder"]
    assert _names_and_shapes(lambda: VocoderWithBWE(LTX2VocoderWithBWEConfig())) == shapes["bwe"]
    assert LTX2VocoderConfig().samples_per_frame * 16000 // LTX2AudioVAEConfig().mel_hop_length == 24000


def test_loading_reports_every_problem(pipeline_folder, tmp_path):
    """Instant (no compile). A folder with a tensor missing, one extra and one mis-shaped is refused
    naming all three; the configs round-trip through ``config.json``."""
    root, vae, _ = pipeline_folder
    tensors = {f"decoder.{name}": t for name, t in _state(vae.decoder).items()}
    tensors.pop("decoder.conv_out.conv.bias")
    tensors["decoder.extra"] = np.zeros(1, np.float32)
    tensors["decoder.conv_in.conv.weight"] = np.zeros((1, 1, 3, 3), np.float32)
    config = LTX2AudioVAEConfig(**VAE_CONFIG)
    with pytest.raises(WeightsError) as error:
        load_module(lambda: AudioDecoder(config), tensors, prefix="decoder.")
    assert error.value.missing == ["decoder.conv_out.conv.bias"]
    assert error.value.unexpected == ["decoder.extra"]
    assert [m.split(":")[0] for m in error.value.misshaped] == ["decoder.conv_in.conv.weight"]
    assert LTX2AudioVAEConfig.from_dict(dict(vae.config)) == config
    for cls, fields in ((LTX2VocoderConfig, VOCODER_CONFIG), (LTX2VocoderWithBWEConfig, BWE_CONFIG)):
        assert cls.from_dict(cls(**fields).to_dict()) == cls(**fields)
