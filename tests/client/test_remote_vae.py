"""``RemoteVAE`` as a diffusers pipeline's own VAE: each pipeline, built from tiny random parts (the
prompt embeddings passed directly; nothing downloaded), gives the same output with the VAE served by
a real uvicorn server as with the same weights decoded by diffusers in the test — and another
seed's weights give another output (the negative control). One server per family.

Tolerances: ``frames="float16"`` answers float16 frames in [-1, 1], rounded by at most half a step
(2^-12 near 1), which is 2^-13 once the pipeline maps them to [0, 1]; with the float32 parity of the
decoders (``PARITY_TOL``) that is ``FLOAT16_TOL``. ``frames="uint8"`` is held to the uint8 rule
of every decode (``assert_uint8_frames_match``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import PIL.Image
import pytest

from tests.helpers.frames import assert_uint8_frames_match
from tests.helpers.hunyuan_reference import HY15_TINY
from tests.helpers.image_reference import FLUX1_TINY, QWEN_TINY, SD_TINY
from tests.helpers.ltx_reference import LTX095
from tests.helpers.service_helpers import thread_server
from tests.helpers.wan_reference import PARITY_TOL
from vaeserve import models

torch = pytest.importorskip("torch", reason="the pipeline wrapper needs torch")
diffusers = pytest.importorskip("diffusers", reason="the pipelines are diffusers'")
pytest.importorskip("transformers", reason="diffusers' pipelines need transformers to be built")

from vaeserve.client import RemoteVAE  # noqa: E402  (after the skips: it needs torch and diffusers)

FLOAT16_TOL = 2**-13 + PARITY_TOL
FAR = 0.01  # another seed's weights move the output by more than this (measured: tenths)


def saved(vae, folder: Path) -> Path:
    vae.save_pretrained(folder)
    return folder


def served(folder: Path):
    """A real uvicorn server (in a thread) holding the model saved in ``folder``."""
    return thread_server(models.load_vae(str(folder)), max_batch=1)


def model_config(vae) -> dict:
    """A diffusers model's config less diffusers' bookkeeping (``_diffusers_version``, ``_use_default_values``)."""
    return {k: v for k, v in vae.config.items() if k == "_class_name" or not k.startswith("_")}


def as_array(output) -> np.ndarray:
    """A pipeline's frames as numpy: float arrays as they are, PIL images (lists of them) as uint8."""
    frames = output.frames if hasattr(output, "frames") else output.images
    if isinstance(frames, np.ndarray):
        return frames
    if isinstance(frames[0], list):
        return np.stack([np.stack([np.asarray(image) for image in clip]) for clip in frames])
    return np.stack([np.asarray(image) for image in frames])


# ---- Wan 2.1 -----------------------------------------------------------------------------------

def assert_remote_like_local(run, local, remote, other, shape: tuple[int, ...]) -> np.ndarray:
    """``run(vae)`` (a pipeline's output with ``vae`` as its VAE) with ``remote`` within float16's
    rounding of ``run(local)``, and far from ``run(other)`` (another seed's weights: the control);
    the remote output."""
    expected, got = run(local), run(remote)
    assert got.shape == expected.shape == shape
    assert np.abs(got - expected).max() <= FLOAT16_TOL
    assert np.abs(got - run(other)).max() > FAR
    return got


def seeded_diffusers_vae(vae_class, config, seed: int, **overrides):
    """diffusers' ``vae_class`` with our tiny ``config``'s keys (and ``overrides``), its weights drawn
    after ``torch.manual_seed(seed)``: another seed is the controls' other weights."""
    torch.manual_seed(seed)
    keys = {k: v for k, v in config.to_dict().items() if k != "_class_name"}
    return vae_class(**{**keys, **overrides}).eval()


def wan_vae(seed: int):
    torch.manual_seed(seed)
    return diffusers.AutoencoderKLWan(base_dim=8, num_res_blocks=1).eval()


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    local = wan_vae(0)
    torch.manual_seed(10)
    transformer = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32).eval()
    pipe = diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=local, transformer=transformer,
                                 scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0))
    with served(saved(local, tmp_path_factory.mktemp("wan"))) as server:
        yield pipe, local, server.url


def run_wan(pipe, vae, output_type: str) -> np.ndarray:
    pipe.vae = vae
    embeds = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = pipe(prompt_embeds=embeds, guidance_scale=1.0, height=32, width=32, num_frames=5,
                   num_inference_steps=2, generator=torch.Generator().manual_seed(2), output_type=output_type)
    return as_array(out)


def test_wan_pipeline_with_the_remote_vae_gives_the_local_frames(wan):
    pipe, local, url = wan
    remote = RemoteVAE(url)
    assert remote.config == model_config(local) and remote.temperal_downsample == local.temperal_downsample
    got = assert_remote_like_local(lambda vae: run_wan(pipe, vae, "np"), local, remote, wan_vae(1), (1, 5, 32, 32, 3))
    # Built anew around the remote VAE (docs/pipelines.md's recipe), it reads its sizes from it.
    rebuilt = diffusers.WanPipeline(**{**pipe.components, "vae": remote})
    assert rebuilt.vae_scale_factor_spatial == 8 and rebuilt.vae_scale_factor_temporal == 4
    assert np.array_equal(run_wan(rebuilt, remote, "np"), got)


def test_wan_pipeline_uint8_frames_are_the_local_images(wan):
    pipe, local, url = wan
    expected = run_wan(pipe, local, "pil")
    assert_uint8_frames_match(run_wan(pipe, RemoteVAE(url, frames="uint8"), "pil"), expected)
    with pytest.raises(AssertionError):
        assert_uint8_frames_match(run_wan(pipe, wan_vae(1), "pil"), expected)


def test_encode_gives_the_local_posterior_mode_and_a_seeded_draw(wan):
    _, local, url = wan
    remote = RemoteVAE(url)
    frames = torch.rand(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(3)) * 2 - 1
    with torch.no_grad():
        expected = local.encode(frames).latent_dist.mode()
    got = remote.encode(frames).latent_dist.mode()
    assert got.shape == expected.shape == (1, 16, 2, 4, 4)
    assert (got - expected).abs().max() <= PARITY_TOL
    draw = remote.encode(frames).latent_dist.sample(torch.Generator().manual_seed(4))
    again = remote.encode(frames).latent_dist.sample(torch.Generator().manual_seed(4))
    assert torch.equal(draw, again) and (draw - got).abs().max() > FAR


def test_the_uint8_levels_come_back_through_the_pipelines_rounding():
    """Every level ``v`` sent as ``v / 127.5 − 1`` is rounded back to ``v`` by the post-processing
    pipelines apply (``VaeImageProcessor``: ``(x / 2 + 0.5).clamp(0, 1)``, then ``round(255 · x)``)."""
    levels = torch.arange(256, dtype=torch.uint8)
    sent = levels.to(torch.float32) / 127.5 - 1
    images = diffusers.image_processor.VaeImageProcessor().postprocess(sent.view(1, 1, 16, 16).expand(1, 3, 16, 16),
                                                                       output_type="pil")
    assert np.array_equal(np.asarray(images[0])[..., 0].reshape(-1), levels.numpy())
    # The control: the levels sent as v / 127.5 − 1 + half a level's width land on another level.
    shifted = diffusers.image_processor.VaeImageProcessor().postprocess(
        (sent + 1 / 255).view(1, 1, 16, 16).expand(1, 3, 16, 16), output_type="pil")
    assert not np.array_equal(np.asarray(shifted[0])[..., 0].reshape(-1), levels.numpy())


def test_a_model_the_server_does_not_serve_is_named(wan):
    with pytest.raises(ValueError, match=r"the server serves \['.*'\]; asked for 'ltx2'"):
        RemoteVAE(wan[2], model="ltx2")


# ---- Flux.1 ------------------------------------------------------------------------------------

def flux_vae(seed: int):
    return seeded_diffusers_vae(diffusers.AutoencoderKL, FLUX1_TINY, seed)


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    local = flux_vae(0)
    torch.manual_seed(11)
    transformer = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]).eval()
    pipe = diffusers.FluxPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=local,
                                  text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
                                  transformer=transformer)
    with served(saved(local, tmp_path_factory.mktemp("flux"))) as server:
        yield pipe, local, server.url


def run_flux(pipe, vae, output_type: str) -> np.ndarray:
    pipe.vae = vae
    generator = torch.Generator().manual_seed(5)
    embeds, pooled = torch.randn(1, 8, 32, generator=generator), torch.randn(1, 32, generator=generator)
    with torch.no_grad():
        out = pipe(prompt_embeds=embeds, pooled_prompt_embeds=pooled, height=32, width=32, num_inference_steps=2,
                   guidance_scale=1.0, generator=torch.Generator().manual_seed(6), output_type=output_type)
    return as_array(out)


def test_flux_pipeline_with_the_remote_vae_gives_the_local_images(flux):
    pipe, local, url = flux
    assert_remote_like_local(lambda vae: run_flux(pipe, vae, "np"),
                             local, RemoteVAE(url), flux_vae(1), (1, 32, 32, 3))
    assert_uint8_frames_match(run_flux(pipe, RemoteVAE(url, frames="uint8"), "pil"), run_flux(pipe, local, "pil"))


# ---- LTX-Video (a timestep-conditioned decoder) ------------------------------------------------

def ltx_vae(seed: int):
    # LTX-Video 0.9.5's decoder, timestep-conditioned, without noise of its own (which the server
    # and torch would draw differently); its scales (8x, 8x in time) given, as the pipeline reads them.
    return seeded_diffusers_vae(diffusers.AutoencoderKLLTXVideo, LTX095, seed, decoder_inject_noise=(False,) * 4,
                                spatial_compression_ratio=8, temporal_compression_ratio=8)


@pytest.fixture(scope="module")
def ltx(tmp_path_factory):
    local = ltx_vae(0)
    torch.manual_seed(12)
    transformer = diffusers.LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4, attention_head_dim=8,
        cross_attention_dim=32, num_layers=1, caption_channels=32).eval()
    pipe = diffusers.LTXPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=local, text_encoder=None,
                                 tokenizer=None, transformer=transformer)
    with served(saved(local, tmp_path_factory.mktemp("ltx"))) as server:
        yield pipe, local, server.url


def run_ltx(pipe, vae, decode_timestep) -> np.ndarray:
    pipe.vae = vae
    embeds = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        out = pipe(prompt_embeds=embeds, prompt_attention_mask=torch.ones(2, 8), guidance_scale=1.0, height=32,
                   width=32, num_frames=9, num_inference_steps=2, decode_timestep=decode_timestep,
                   decode_noise_scale=0.025, generator=torch.Generator().manual_seed(8), output_type="np")
    return as_array(out)


def test_ltx_pipeline_passes_its_decode_timestep_through(ltx):
    pipe, local, url = ltx
    timesteps = [0.3, 0.6]  # a row each (two requests), neither the server's default
    got = assert_remote_like_local(lambda vae: run_ltx(pipe, vae, timesteps),
                                   local, RemoteVAE(url), ltx_vae(1), (2, 9, 32, 32, 3))
    # The control of the timestep itself: the frames of other timesteps are far from these.
    assert np.abs(got - run_ltx(pipe, local, [0.05, 0.05])).max() > FAR


# ---- SDXL ----------------------------------------------------------------------------------------

def sdxl_vae(seed: int):
    return seeded_diffusers_vae(diffusers.AutoencoderKL, SD_TINY, seed, scaling_factor=0.13025)


@pytest.fixture(scope="module")
def sdxl(tmp_path_factory):
    local = sdxl_vae(0)
    torch.manual_seed(13)
    unet = diffusers.UNet2DConditionModel(
        block_out_channels=(4, 8), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, transformer_layers_per_block=(1, 1), projection_class_embeddings_input_dim=80,
        cross_attention_dim=64, norm_num_groups=1).eval()
    pipe = diffusers.StableDiffusionXLPipeline(vae=local, text_encoder=None, text_encoder_2=None, tokenizer=None,
                                               tokenizer_2=None, unet=unet, scheduler=diffusers.EulerDiscreteScheduler())
    with served(saved(local, tmp_path_factory.mktemp("sdxl"))) as server:
        yield pipe, local, server.url


def run_sdxl(pipe, vae, output_type: str) -> np.ndarray:
    pipe.vae = vae
    generator = torch.Generator().manual_seed(9)
    embeds, pooled = torch.randn(1, 8, 64, generator=generator), torch.randn(1, 32, generator=generator)
    with torch.no_grad():
        out = pipe(prompt_embeds=embeds, pooled_prompt_embeds=pooled, height=32, width=32, num_inference_steps=2,
                   guidance_scale=1.0, generator=torch.Generator().manual_seed(10), output_type=output_type)
    return as_array(out)


def test_sdxl_pipeline_with_the_remote_vae_gives_the_local_images(sdxl):
    pipe, local, url = sdxl
    assert_remote_like_local(lambda vae: run_sdxl(pipe, vae, "np"),
                             local, RemoteVAE(url), sdxl_vae(1), (1, 32, 32, 3))


# ---- Qwen-Image (one-frame clips) ----------------------------------------------------------------

def qwen_vae(seed: int):
    return seeded_diffusers_vae(diffusers.AutoencoderKLQwenImage, QWEN_TINY, seed)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    local = qwen_vae(0)
    torch.manual_seed(14)
    transformer = diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4)).eval()
    pipe = diffusers.QwenImagePipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=local,
                                       text_encoder=None, tokenizer=None, transformer=transformer)
    with served(saved(local, tmp_path_factory.mktemp("qwen"))) as server:
        yield pipe, local, server.url


def run_qwen(pipe, vae, output_type: str) -> np.ndarray:
    pipe.vae = vae
    embeds = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        out = pipe(prompt_embeds=embeds, prompt_embeds_mask=torch.ones(1, 8, dtype=torch.long), height=32, width=32,
                   num_inference_steps=2, generator=torch.Generator().manual_seed(12), output_type=output_type)
    return as_array(out)


def test_qwen_image_pipeline_with_the_remote_vae_gives_the_local_images(qwen):
    pipe, local, url = qwen
    assert_remote_like_local(lambda vae: run_qwen(pipe, vae, "np"),
                             local, RemoteVAE(url), qwen_vae(1), (1, 32, 32, 3))


# ---- HunyuanVideo 1.5 ----------------------------------------------------------------------------

def hunyuan15_vae(seed: int):
    return seeded_diffusers_vae(diffusers.AutoencoderKLHunyuanVideo15, HY15_TINY, seed)


@pytest.fixture(scope="module")
def hunyuan15(tmp_path_factory):
    local = hunyuan15_vae(0)
    channels = local.config.latent_channels
    torch.manual_seed(15)
    transformer = diffusers.HunyuanVideo15Transformer3DModel(
        in_channels=2 * channels + 1, out_channels=channels, num_attention_heads=2, attention_head_dim=16, num_layers=1,
        num_refiner_layers=1, text_embed_dim=16, text_embed_2_dim=8, image_embed_dim=8, rope_axes_dim=(4, 6, 6),
        task_type="t2v").eval()
    pipe = diffusers.HunyuanVideo15Pipeline(
        text_encoder=None, tokenizer=None, transformer=transformer, vae=local,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), text_encoder_2=None, tokenizer_2=None,
        guider=diffusers.ClassifierFreeGuidance(guidance_scale=1.0, enabled=False))
    with served(saved(local, tmp_path_factory.mktemp("hunyuan15"))) as server:
        yield pipe, local, server.url


def run_hunyuan15(pipe, vae, output_type: str) -> np.ndarray:
    pipe.vae = vae
    generator = torch.Generator().manual_seed(13)
    embeds, embeds_2 = torch.randn(1, 8, 16, generator=generator), torch.randn(1, 4, 8, generator=generator)
    with torch.no_grad():
        out = pipe(prompt_embeds=embeds, prompt_embeds_mask=torch.ones(1, 8, dtype=torch.long),
                   prompt_embeds_2=embeds_2, prompt_embeds_mask_2=torch.ones(1, 4, dtype=torch.long), height=32,
                   width=32, num_frames=5, num_inference_steps=2, generator=torch.Generator().manual_seed(14),
                   output_type=output_type)
    return as_array(out)


def test_hunyuan_video15_pipeline_with_the_remote_vae_gives_the_local_frames(hunyuan15):
    pipe, local, url = hunyuan15
    assert_remote_like_local(lambda vae: run_hunyuan15(pipe, vae, "np"),
                             local, RemoteVAE(url), hunyuan15_vae(1), (1, 5, 32, 32, 3))


def test_wan_image_to_video_pipeline_encodes_its_image_on_the_server(wan):
    """Wan 2.1's image-to-video pipeline encodes the image and zero frames (``encode(...).latent_dist``,
    its mode) before it denoises, and decodes at the end: both through the server."""
    pipe, local, url = wan
    torch.manual_seed(16)
    transformer = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=36, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32).eval()
    i2v = diffusers.WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=local, scheduler=pipe.scheduler,
                                            transformer=transformer)
    image = PIL.Image.fromarray(np.random.default_rng(17).integers(0, 256, (32, 32, 3), dtype=np.uint8))

    def run_i2v(vae) -> np.ndarray:
        i2v.vae = vae
        embeds = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(18))
        with torch.no_grad():
            return i2v(image=image, prompt_embeds=embeds, guidance_scale=1.0, height=32, width=32, num_frames=5,
                       num_inference_steps=2, generator=torch.Generator().manual_seed(19), output_type="np").frames

    assert_remote_like_local(run_i2v, local, RemoteVAE(url), wan_vae(1), (1, 5, 32, 32, 3))
