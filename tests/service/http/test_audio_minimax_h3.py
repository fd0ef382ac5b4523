"""MiniMax-H3's sound served beside the video (docs/audio.md), in-process: a pipeline folder with a
tiny video VAE (``vae/``) and a tiny MiniMax-H3 audio VAE (``audio_vae/``), written as diffusers
folders and loaded as the server loads any pipeline folder.

Its latents are the pipeline's ``(2, latent_channels, L)`` (a stereo pair of mono latents), with a
batch dim first; one request with the video's answers an MP4 whose video track equals the
video-only answer and whose AAC track decodes to the audio VAE's waveform within the codec's loss
(another waveform, the control, does not); FLAC holds exactly its 16-bit PCM; a sound out of sync
with the video is refused. Two compiled programs (the video's steps, one sound decode): ~15 s on 2 cores.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from tests.helpers.service_helpers import LATENT, app_client, latents, make_test_model
from tests.helpers.sound_helpers import SNR_DB, body, npy_of, post_decode, snr_db, write_folder
from vaeserve import models
from vaeserve.models.families.minimax_h3_audio.config import MiniMaxH3AudioConfig
from vaeserve.models.families.minimax_h3_audio.pipeline import H3AudioDecodePath, decode_audio, h3_audio_statistics
from vaeserve.models.families.minimax_h3_audio.sound import H3Sound, random_sound, sound_info
from vaeserve.models.registry import SOUND_FAMILIES, sound_family_of
from vaeserve.service.codecs.audio import pcm16, read_sound
from vaeserve.service.codecs.video import read_mp4

# Hop 40 at 8 kHz (AAC's lowest common rate): 200 latent frames a second; 8 latent channels with
# statistics that are not 0 and 1 (the decode denormalises per channel).
CONFIG = MiniMaxH3AudioConfig(encoder_dim=4, encoder_rates=(2, 4, 5), latent_dim=16, latent_channels=8,
                              num_attention_heads=2, decoder_dim=16, decoder_rates=(5, 4, 2),
                              decoder_kernel_sizes=(9, 8, 4), resblock_kernel_sizes=(3,),
                              resblock_dilation_sizes=((1, 3),), sampling_rate=8000,
                              latents_mean=tuple(0.1 * i - 0.3 for i in range(8)),
                              latents_std=tuple(0.5 + 0.1 * i for i in range(8)))
FPS = 20  # LATENT's 5 frames at 20 fps: 0.25 s, 50 audio latent frames
AUDIO = (1, 2, 8, 50)


def flat(state) -> dict[str, np.ndarray]:
    return {".".join(map(str, path)): np.asarray(var.get_value()) for path, var in nnx.to_flat_state(state)}


@pytest.fixture(scope="module")
def sound() -> H3Sound:
    return random_sound(seed=1, config=CONFIG)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, sound) -> Path:
    """A pipeline folder: ``vae/`` and ``audio_vae/`` (the decoder's and the encoder's weights)."""
    root = tmp_path_factory.mktemp("h3-pipeline")
    models.save_vae(make_test_model(), root / "vae")
    write_folder(root / "audio_vae", {"_class_name": CONFIG.class_name, **CONFIG.to_dict()},
                 flat(sound.state) | flat(sound.encoder_state))
    return root


@pytest.fixture(scope="module")
def client(pipeline):
    with app_client(None, model=[str(pipeline)], max_audio_seconds=1.0) as client:
        yield client


def audio_latents(shape=AUDIO, seed: int = 1) -> np.ndarray:
    return latents(shape, seed)


def post(client, content: bytes, **params):
    return post_decode(client, content, fps=FPS, **params)


def waveform_of(client, seed: int = 1) -> np.ndarray:
    """The served waveform ``(2, samples)`` of ``audio_latents(seed=seed)``, as npy."""
    return npy_of(post(client, body(audio_latents=audio_latents(seed=seed)), output_type="npy"))[0]


def test_a_pipeline_folder_with_h3s_audio_vae_is_served_with_its_sound(pipeline, client):
    assert sound_family_of(str(pipeline)) is SOUND_FAMILIES["minimax_h3_audio"] is sound_family_of("minimax-h3")
    described = client.get("/v1/models").json()["data"][0]["sound"]
    assert described["latent_layout"] == "2x8xL" and described["latent_channels"] == 8 and described["channels"] == 2
    assert described["sample_rate"] == 8000 and described["samples_per_latent_frame"] == 40
    assert described["latent_frames_per_second"] == 200 and described["encodes"] is True


def test_the_sync_rule_is_h3_pipelines():
    """diffusers sizes the sound of F frames at H3's 24 fps as round(F / 24 · 40) latents; ours, read
    from the release's config, is the same rule."""
    modular = pytest.importorskip("diffusers.modular_pipelines.minimax_h3.modular_pipeline")
    info = sound_info(MiniMaxH3AudioConfig())
    assert info.latent_frames_per_second == modular.MINIMAX_H3_AUDIO_LATENTS_PER_SECOND
    assert info.channels == modular.MINIMAX_H3_AUDIO_CHANNELS
    frames = (121, 125, 241, 360)
    assert [info.frames_for_video(f, modular.MINIMAX_H3_FPS) for f in frames] == [
        modular.audio_latent_num_frames(f) for f in frames]
    assert info.frames_for_video(125, 25) != modular.audio_latent_num_frames(125)  # the control: the fps counts


def test_npy_is_the_pipelines_decode(client, sound):
    """Each row decodes as the pipeline's decode step does (``decode_audio``: its stereo pair as the batch)."""
    path = H3AudioDecodePath(nnx.merge(sound._decoder_graph, sound.state), h3_audio_statistics(CONFIG))
    expected = np.asarray(jax.jit(decode_audio)(path, audio_latents()[0]))[0]
    waveform = waveform_of(client)
    assert waveform.shape == (2, 50 * 40) and np.abs(waveform - expected).max() <= 1e-5
    assert np.abs(waveform_of(client, seed=2) - expected).max() > 1e-2  # the control: another sound differs


def test_mp4_audio_track_is_the_waveform_within_aacs_loss_and_flac_is_exact(client):
    video_only = post(client, body(latents=latents(LATENT)))
    answer = post(client, body(latents=latents(LATENT), audio_latents=audio_latents()))
    assert answer.status_code == 200, answer.text
    assert np.array_equal(read_mp4(answer.content), read_mp4(video_only.content))
    waveform = waveform_of(client)
    track, rate = read_sound(answer.content)
    assert rate == 8000 and track.shape == waveform.shape and abs(track.shape[1] / rate - 5 / FPS) < 1 / FPS
    assert snr_db(waveform, track) > SNR_DB
    assert snr_db(waveform_of(client, seed=2), track) < SNR_DB  # the control: the track is not any sound
    flac = post(client, body(latents=latents(LATENT), audio_latents=audio_latents()), output_type="flac")
    decoded, rate = read_sound(flac.content)
    assert rate == 8000 and np.array_equal(decoded, pcm16(waveform))
    assert not np.array_equal(decoded, pcm16(waveform * 0.99))  # the control: a louder sound differs


@pytest.mark.parametrize(("frames", "status"), [(50, 200), (51, 200), (40, 422), (60, 422)])
def test_a_sound_out_of_sync_is_refused(client, frames, status):
    """50 latent frames are 0.25 s, the video's 5 frames at 20 fps; one off is within the slack."""
    answer = post(client, body(latents=latents(LATENT), audio_latents=audio_latents((1, 2, 8, frames))),
                  output_type="flac")
    assert answer.status_code == status, answer.text
    if status == 422:
        problem = answer.json()
        assert problem["type"].endswith("audio-out-of-sync") and problem["expected"] == "50 (±1) audio latent frames"
        assert problem["received"] == frames


# -- encode: a sound to audio latents ----------------------------------------------------------------
def post_encode(client, content: bytes, content_type: str, **params):
    return client.post("/v1/encode", content=content, params={"output_type": "npy", **params},
                       headers={"Content-Type": content_type})


def encoded(sound: H3Sound, waveform: np.ndarray) -> np.ndarray:
    """The sound's own encode of ``(channels, samples)`` float32: the reference (one compile per shape)."""
    return np.asarray(jitted_encode(sound)(sound.encoder_state, waveform[None].astype(np.float32)))


@functools.cache
def jitted_encode(sound: H3Sound):
    return jax.jit(sound.encode)


def test_a_flac_or_wav_encodes_to_the_latents_of_its_pcm(client, sound):
    """The body's 16-bit PCM reads as x / 32767 and encodes as the audio VAE's encoder does; the
    latents decode back to a waveform of the same length (the sync rule's layout)."""
    waveform = waveform_of(client)
    expected = encoded(sound, pcm16(waveform) / np.float32(32767))
    flac = post(client, body(audio_latents=audio_latents()), output_type="flac").content
    answer = post_encode(client, flac, "audio/flac")
    latents_ = npy_of(answer)
    assert latents_.shape == AUDIO and np.abs(latents_ - expected).max() <= 1e-4
    assert np.abs(encoded(sound, waveform_of(client, seed=2)) - latents_).max() > 1e-2  # the control
    wav = post(client, body(audio_latents=audio_latents()), output_type="wav").content
    assert np.array_equal(npy_of(post_encode(client, wav, "audio/wav")), latents_)  # the same PCM, the same latents
    assert ["sound", [1, 2, 2000], "latents"] in client.get("/v1/models").json()["data"][0]["compiled"]
    assert waveform_of(client).shape == (2, 2000)  # decoded back: as long as the sound encoded


def test_an_mp4s_sound_track_encodes_with_audio_true(client, sound):
    mp4 = post(client, body(latents=latents(LATENT), audio_latents=audio_latents())).content
    track, _ = read_sound(mp4)
    answer = npy_of(post_encode(client, mp4, "video/mp4", audio="true"))
    assert answer.shape == AUDIO and np.abs(answer - encoded(sound, track)).max() <= 1e-4
    assert np.abs(answer - encoded(sound, track[::-1])).max() > 1e-2  # the control: the channels in their order


def sound_file(samples: int = 2000, channels: int = 2, rate: int = 8000) -> bytes:
    from vaeserve.service.codecs.audio import wav_bytes

    return wav_bytes(np.random.default_rng(0).uniform(-0.5, 0.5, (channels, samples)).astype(np.float32), rate)


def float_wav(samples: np.ndarray, rate: int = 8000) -> bytes:
    """A 32-bit float WAV (format 3, IEEE float) of ``(channels, samples)``: the format that can hold NaN."""
    channels, data = samples.shape[0], np.ascontiguousarray(samples.T, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * channels * 4, channels * 4, 32)
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt))
            + fmt + b"data" + struct.pack("<I", len(data)) + data)


NAN_SOUND = np.zeros((2, 2000), np.float32)
NAN_SOUND[1, 7] = np.nan


@pytest.mark.parametrize(("content", "params", "kind", "expected", "received"), [
    (sound_file(rate=16000), {}, "invalid-sample-rate", 8000, 16000),
    (sound_file(channels=1), {}, "invalid-channels", 2, 1),
    (sound_file(samples=8001), {}, "audio-too-long", "1 to 8000 samples", 8001),  # over max_audio_seconds, 1 s
    (b"RIFF not a wave file", {}, "invalid-sound", None, None),
    (float_wav(NAN_SOUND), {}, "non-finite", "finite values", "1 non-finite of 4000"),
    (sound_file(), {"sample": "true"}, "invalid-parameter", None, "sample=true"),
])
def test_a_sound_the_encoder_does_not_take_is_a_problem_and_the_server_serves_on(client, content, params, kind,
                                                                                   expected, received):
    answer = post_encode(client, content, "audio/wav", **params)
    assert answer.status_code == 422, answer.text
    problem = answer.json()
    assert answer.headers["content-type"] == "application/problem+json" and problem["type"].endswith(kind), problem
    if expected is not None:
        assert problem["expected"] == expected
    if received is not None:
        assert problem["received"] == received
    assert post_encode(client, sound_file(), "audio/wav").status_code == 200  # the control: a sound it takes
    assert post_encode(client, float_wav(np.nan_to_num(NAN_SOUND)), "audio/wav").status_code == 200  # a float WAV


def test_a_sound_encode_too_large_for_the_memory_is_refused_and_the_server_serves_on(pipeline):
    """The encode's program is compiled and checked against the device's memory like every program."""
    with app_client(None, model=[str(pipeline)], device_memory_bytes=200_000) as client:
        answer = post_encode(client, sound_file(), "audio/wav")
        assert answer.status_code == 422, answer.text
        problem = answer.json()
        assert problem["type"].endswith("too-large-for-memory") and "sound encode" in problem["detail"], problem
        assert client.get("/readyz").status_code == 200
