"""A video model served with its sound (docs/audio.md), in-process: a pipeline folder with a tiny
video VAE (``vae/``) and a tiny LTX-2 audio VAE and vocoder (``audio_vae/``, ``vocoder/``), written
as diffusers folders and loaded as the server loads any pipeline folder.

One request with ``latents`` and ``audio_latents`` answers an MP4 whose video track equals the
video-only answer and whose AAC track decodes to the vocoder's waveform within the codec's loss
(a different waveform, the control, does not); FLAC and WAV hold exactly its 16-bit PCM; npy the
waveform as the model decodes it. Bad sound inputs get problem+json and the server serves on.
Two compiled programs in all (the video's steps, one sound decode): about 20 s on 2 cores.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from tests.helpers.service_helpers import LATENT, app_client, latents, make_test_model
from tests.helpers.sound_helpers import SNR_DB, body, npy_of, post_decode, snr_db, write_folder
from vaeserve import models
from vaeserve.models.families.ltx2_audio.config import LTX2AudioVAEConfig, LTX2VocoderConfig
from vaeserve.models.families.ltx2_audio.sound import LTX2Sound, random_sound
from vaeserve.models.registry import SOUND_FAMILIES, sound_family_of
from vaeserve.models.sound import SoundInfo
from vaeserve.service.codecs.audio import pcm16, read_sound
from vaeserve.service.codecs.video import read_mp4

# Three levels as the release (4 mel frames per latent frame), 2 latent channels x 4 latent mel bins.
AUDIO_VAE = LTX2AudioVAEConfig(base_channels=8, ch_mult=(1, 2, 2), num_res_blocks=1, latent_channels=2, mel_bins=16)
# 20 samples per mel frame at 8 kHz (AAC's lowest common rate): 80 per latent frame, 100 per second.
VOCODER = LTX2VocoderConfig(in_channels=32, hidden_channels=32, upsample_kernel_sizes=(11, 8),
                            upsample_factors=(5, 4), resnet_kernel_sizes=(3,), resnet_dilations=((1, 3),),
                            output_sampling_rate=8000)
FPS = 20  # LATENT's 5 frames at 20 fps: 0.25 s, 25 audio latent frames
AUDIO = (1, 2, 25, 4)


def flat(state, part: int) -> dict[str, np.ndarray]:
    """Diffusers' names and values of the ``part``-th module of a ``(decoder, vocoder)`` state."""
    return {".".join(map(str, path[1:])): np.asarray(var.get_value())
            for path, var in nnx.to_flat_state(state) if path[0] == part}


def save_sound(sound: LTX2Sound, root: Path) -> None:
    """The sound's weights as a pipeline folder's ``audio_vae/`` and ``vocoder/``."""
    vae_tensors = {f"decoder.{name}": value for name, value in flat(sound.state, 0).items()}
    features = AUDIO_VAE.latent_channels * AUDIO_VAE.latent_mel_bins()
    vae_tensors |= {"latents_mean": np.zeros(features, np.float32), "latents_std": np.ones(features, np.float32)}
    write_folder(root / "audio_vae", {"_class_name": AUDIO_VAE.class_name, **AUDIO_VAE.to_dict()}, vae_tensors)
    write_folder(root / "vocoder", {"_class_name": VOCODER.class_name, **VOCODER.to_dict()}, flat(sound.state, 1))


@pytest.fixture(scope="module")
def sound() -> LTX2Sound:
    return random_sound(seed=1, vae=AUDIO_VAE, vocoder=VOCODER)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, sound) -> Path:
    """A pipeline folder: ``vae/``, ``audio_vae/``, ``vocoder/``."""
    root = tmp_path_factory.mktemp("pipeline")
    models.save_vae(make_test_model(), root / "vae")
    save_sound(sound, root)
    return root


@pytest.fixture(scope="module")
def client(pipeline):
    with app_client(None, model=[str(pipeline)], max_audio_seconds=1.0) as client:
        yield client


def audio_latents(shape=AUDIO, seed: int = 1) -> np.ndarray:
    return latents(shape, seed)


def post(client, content: bytes, **params):
    return post_decode(client, content, fps=FPS, **params)


def test_a_pipeline_folder_is_served_with_the_sound_it_holds(tmp_path_factory, pipeline):
    root = pipeline
    assert sound_family_of(str(root)) is SOUND_FAMILIES["ltx2_audio"] is sound_family_of(str(root / "vae"))
    assert sound_family_of("ltx2") is SOUND_FAMILIES["ltx2_audio"] and sound_family_of("wan2.1") is None
    other = tmp_path_factory.mktemp("other")
    shutil.copytree(root, other, dirs_exist_ok=True)
    config = other / "audio_vae" / "config.json"
    config.write_text(config.read_text().replace(AUDIO_VAE.class_name, "AutoencoderKLMiniMaxH3Audio"))
    assert sound_family_of(str(other)) is SOUND_FAMILIES["minimax_h3_audio"]  # the class name tells them apart
    config.write_text(config.read_text().replace("AutoencoderKLMiniMaxH3Audio", "AutoencoderKLUnknownAudio"))
    assert sound_family_of(str(other)) is None  # the control: an audio VAE no family names is served by none


def test_the_sync_rule_is_ltx2_pipelines():
    """LTX2Pipeline sizes the sound of F frames as round(F / fps · sample_rate / hop / 4) latent
    frames from the audio VAE's config; the rule here reads the vocoder's output: the same for the release."""
    vae, vocoder = LTX2AudioVAEConfig(), LTX2VocoderConfig()
    per_second = vae.sample_rate / vae.mel_hop_length / 4
    assert vocoder.output_sampling_rate / (4 * vocoder.samples_per_frame) == per_second == 25
    info = SoundInfo(title="release", sample_rate=24000, channels=2, layout=(8, None, 16), samples_per_latent_frame=960)
    assert [info.frames_for_video(f, 24) for f in (121, 97, 25)] == [round(f / 24 * per_second) for f in (121, 97, 25)]


def test_models_says_the_sound(client):
    sound = client.get("/v1/models").json()["data"][0]["sound"]
    assert sound["sample_rate"] == 8000 and sound["channels"] == 2 and sound["latent_channels"] == 2
    assert sound["latent_layout"] == "2xLx4" and sound["samples_per_latent_frame"] == 80
    assert sound["latent_frames_per_second"] == 100 and sound["encodes"] is False


def test_npy_is_the_models_waveform(client, sound):
    answer = post(client, body(audio_latents=audio_latents()), output_type="npy")
    assert answer.status_code == 200, answer.text
    waveform = npy_of(answer)
    expected = np.asarray(jax.jit(sound.apply)(sound.state, audio_latents()))
    assert waveform.shape == (1, 2, 25 * 80 - 60) and answer.headers["X-Sample-Rate"] == "8000"
    assert np.abs(waveform - expected).max() <= 1e-5
    other = np.asarray(jax.jit(sound.apply)(sound.state, audio_latents(seed=2)))
    assert np.abs(other - expected).max() > 1e-2  # the control: another sound is another waveform
    assert ["sound", list(AUDIO), "waveform"] in client.get("/v1/models").json()["data"][0]["compiled"]


def test_flac_and_wav_are_the_pcm_of_the_waveform(client):
    waveform = npy_of(post(client, body(audio_latents=audio_latents()), output_type="npy"))[0]
    for output_type in ("flac", "wav"):
        answer = post(client, body(latents=latents(LATENT), audio_latents=audio_latents()), output_type=output_type)
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == f"audio/{output_type}"
        decoded, rate = read_sound(answer.content)
        assert rate == 8000 and np.array_equal(decoded, pcm16(waveform)), output_type
    assert not np.array_equal(pcm16(waveform), pcm16(waveform * 0.99))  # the control: a louder sound differs


def test_mp4_with_sound_has_both_tracks_in_sync(client):
    video_only = client.post("/v1/decode", content=body(latents=latents(LATENT)), params={"fps": FPS, "crf": 0},
                             headers={"Content-Type": "application/x-safetensors"})
    assert video_only.status_code == 200, video_only.text
    answer = post(client, body(latents=latents(LATENT), audio_latents=audio_latents()))
    assert answer.status_code == 200, answer.text
    assert np.array_equal(read_mp4(answer.content), read_mp4(video_only.content))
    waveform = npy_of(post(client, body(audio_latents=audio_latents()), output_type="npy"))[0]
    track, rate = read_sound(answer.content)
    assert rate == 8000 and track.shape == waveform.shape  # the edit list trims AAC's priming: same length
    assert abs(track.shape[1] / rate - 5 / FPS) < 1 / FPS  # the sound lasts as long as the video, within a frame
    assert snr_db(waveform, track) > SNR_DB
    other = npy_of(post(client, body(audio_latents=audio_latents(seed=2)), output_type="npy"))[0]
    assert snr_db(other, track) < SNR_DB  # the control: the track is not any sound


@pytest.mark.parametrize(("tensors", "params", "kind"), [
    ({"audio_latents": latents((1, 3, 25, 4))}, {}, "invalid-audio-latents"),  # 3 channels, not 2
    ({"audio_latents": latents((1, 2, 40, 4))}, {}, "audio-out-of-sync"),  # 0.4 s of sound for 0.25 s of video
    ({"audio_latents": np.full(AUDIO, np.nan, np.float32)}, {}, "non-finite"),
    ({"audio_latents": latents((1, 2, 101, 4))}, {"output_type": "wav"}, "audio-too-long"),  # over 1 s
    ({"audio_latents": latents(AUDIO)}, {"stream": "true"}, "invalid-parameter"),  # a raw frame stream
    ({"audio_latents": latents(AUDIO)}, {"output_type": "pt"}, "invalid-parameter"),
    ({}, {"output_type": "flac"}, "missing-tensor"),
])
def test_bad_sound_is_a_problem_and_the_server_serves_on(client, tensors, params, kind):
    answer = post(client, body(latents=latents(LATENT), **tensors), **params)
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    problem = answer.json()
    assert problem["type"].endswith(kind) and "expected" in problem and "received" in problem, problem
    assert post(client, body(audio_latents=audio_latents()), output_type="npy").status_code == 200


def test_the_sync_rule_in_the_problem(client):
    problem = post(client, body(latents=latents(LATENT), audio_latents=latents((1, 2, 40, 4)))).json()
    assert problem["expected"] == "25 (±1) audio latent frames" and problem["received"] == 40
    assert post(client, body(latents=latents(LATENT), audio_latents=latents((1, 2, 26, 4))),
                output_type="flac").status_code == 200  # within the slack


def test_ltx2s_sound_does_not_encode(client):
    answer = client.post("/v1/encode", content=b"RIFF", headers={"Content-Type": "audio/wav"})
    assert answer.status_code == 422 and answer.json()["type"].endswith("no-sound-encoder"), answer.text


def test_a_model_without_sound_refuses_audio_latents():
    with app_client(make_test_model()) as client:
        problem = post(client, body(latents=latents(LATENT), audio_latents=audio_latents())).json()
        assert problem["type"].endswith("no-sound") and problem["status"] == 422
        assert client.get("/v1/models").json()["data"][0]["sound"] is None


def fragment_tracks(data: bytes) -> list[int]:
    """The track of each ``moof`` of a fragmented MP4, in order (its ``tfhd``'s track id)."""
    tracks, offset = [], 0
    while offset + 8 <= len(data):
        size, kind = int.from_bytes(data[offset:offset + 4], "big"), data[offset + 4:offset + 8]
        if kind == b"moof":
            at = data.index(b"tfhd", offset, offset + size)
            tracks.append(int.from_bytes(data[at + 8:at + 12], "big"))
        offset += size
    return tracks


def test_fragmented_mp4_interleaves_the_sound_with_the_frames(client):
    streamed = post(client, body(latents=latents(LATENT), audio_latents=audio_latents()), stream="true",
                    output_type="mp4")
    assert streamed.status_code == 200, streamed.text
    video_only = client.post("/v1/decode", content=body(latents=latents(LATENT)), params={"fps": FPS, "crf": 0},
                             headers={"Content-Type": "application/x-safetensors"})
    assert np.array_equal(read_mp4(streamed.content), read_mp4(video_only.content))
    tracks = fragment_tracks(streamed.content)
    assert tracks[:2] == [1, 2] and tracks.count(1) == 5  # each frame's fragment, then the sound it spans
    assert tracks.index(2) < len(tracks) - tracks[::-1].index(1)  # sound before the last frame: interleaved
    waveform = npy_of(post(client, body(audio_latents=audio_latents()), output_type="npy"))[0]
    track, rate = read_sound(streamed.content)
    assert rate == 8000 and track.shape[1] >= waveform.shape[1]  # whole AAC frames: up to 1023 samples more
    assert snr_db(waveform, track[:, :waveform.shape[1]]) > SNR_DB  # the edit list skips the priming: aligned
    assert snr_db(waveform, track[:, 1:waveform.shape[1] + 1]) < SNR_DB  # the control: a sample off is not


# A page that plays an MP4's bytes through Media Source Extensions, video and sound in one
# SourceBuffer, and says how far it played and how much sound it decoded.
MSE_PAGE = """<!doctype html><video id=v muted></video><script>
const source = new MediaSource(), video = document.getElementById('v');
video.src = URL.createObjectURL(source);
source.addEventListener('sourceopen', async () => {
  const type = 'video/mp4; codecs="avc1.64000a, mp4a.40.2"', result = {supported: MediaSource.isTypeSupported(type)};
  try {
    const buffer = source.addSourceBuffer(type);
    buffer.appendBuffer(await (await fetch('clip.mp4')).arrayBuffer());
    await new Promise(done => buffer.addEventListener('updateend', done, {once: true}));
    source.endOfStream();
    await video.play();
    await new Promise(done => video.addEventListener('ended', done, {once: true}));
    Object.assign(result, {duration: video.duration, ended: video.ended, audioBytes: video.webkitAudioDecodedByteCount});
  } catch (error) { result.error = String(error) + ' ' + (video.error && video.error.message); }
  window.result = result;
});
</script>"""


def test_the_fragmented_mp4_with_sound_plays_in_chromium(client, tmp_path):
    """Chromium's MP4 parser takes the sound track's boxes (mp4a, esds, the edit list) and decodes
    its sound: about 2 s (a browser start)."""
    import functools
    import http.server
    import threading
    import time

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    webdriver = pytest.importorskip("selenium.webdriver")
    if chromium is None or driver is None:
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    streamed = post(client, body(latents=latents(LATENT), audio_latents=audio_latents()), stream="true",
                    output_type="mp4")
    (tmp_path / "clip.mp4").write_bytes(streamed.content)
    (tmp_path / "index.html").write_text(MSE_PAGE)
    class Files(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # the test's output is not a server log
            pass

    files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Files, directory=str(tmp_path)))
    threading.Thread(target=files.serve_forever, daemon=True).start()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--autoplay-policy=no-user-gesture-required",
                 f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(driver))
    try:
        browser.get(f"http://127.0.0.1:{files.server_address[1]}/index.html")
        deadline = time.monotonic() + 30
        while not (result := browser.execute_script("return window.result")) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        browser.quit()
        files.shutdown()
    assert result is not None and "error" not in result, result
    assert result["supported"] and result["ended"] and result["duration"] == pytest.approx(5 / FPS, abs=0.05)
    assert result["audioBytes"] > 0  # it decoded the sound, not the picture alone


def test_a_sound_too_large_for_the_memory_is_refused_and_the_server_serves_on(pipeline):
    """The sound's program is compiled and checked against the device's memory like every
    program: over it, 422 too-large-for-memory, naming the bytes."""
    with app_client(None, model=[str(pipeline)], device_memory_bytes=200_000) as client:
        answer = post(client, body(audio_latents=audio_latents()), output_type="wav")
        assert answer.status_code == 422, answer.text
        problem = answer.json()
        assert problem["type"].endswith("too-large-for-memory") and "sound decode" in problem["detail"], problem
        assert client.get("/readyz").status_code == 200
