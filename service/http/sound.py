"""A decode's sound (docs/audio.md): the audio latents a safetensors body holds beside the video's
(``audio_latents`` and ``latents``, the names ``LTX2Pipeline`` gives them), checked against the
model's sound decoder — its layout, the longest sound, the sync with the video — and the sound
answered alone (WAV, FLAC, npy).

The sync rule: ``F`` frames at ``fps`` last ``F / fps`` seconds; their sound has
``round(F / fps · latent frames per second)`` audio latent frames, give or take ``audio_sync_slack``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from vaeserve.models.shapes import clip_shape
from vaeserve.models.sound import SoundInfo

from ..codecs.audio import Sound, flac_bytes, wav_bytes
from ..codecs.latents import check_latents_content_type, latents_format
from ..codecs.tensors import NPY_CONTENT_TYPE, check_dims, check_finite, npy_bytes, parse_safetensors, safetensors_names
from ..engine.model import ModelState
from ..problem import Problem
from .schemas import DecodeParams

AUDIO_LATENTS, VIDEO_LATENTS = "audio_latents", "latents"
SOUND_FILES = {"wav": (wav_bytes, "audio/wav"), "flac": (flac_bytes, "audio/flac")}
# The answers that carry sound: a sound file, an MP4 with its track, the waveforms as npy.
SOUND_ANSWERS = ["mp4", "wav", "flac", "npy"]


def body_tensors(body: bytes, media_type: str, params: DecodeParams) -> list[str]:
    """The tensor names of a safetensors body ([] for the other formats: they hold one tensor)."""
    if latents_format(check_latents_content_type(media_type), body, params.shape is not None) != "safetensors":
        return []
    return safetensors_names(body)


def sound_alone(params: DecodeParams, has_sound: bool) -> bool:
    """The answer is the sound alone: a WAV or FLAC file, or npy waveforms of a body with sound."""
    return params.output_type in SOUND_FILES or (has_sound and params.output_type == "npy")


def sound_of(model: ModelState) -> SoundInfo:
    """The model's sound decoder's sizes; 422 for a model without one."""
    if model.sound is None:
        raise Problem(422, "no-sound", f"the model {model.name} has no sound decoder: send the video latents alone "
                      "(a pipeline folder with the model's audio VAE, audio_vae/, brings one)",
                      expected="no audio_latents", received=AUDIO_LATENTS)
    return model.sound


def _check_rank(shape: tuple[int, ...], info: SoundInfo) -> None:
    rank = len(info.layout)
    check_dims(shape, what="audio latents", layouts=[f"(B, {info.layout_text()})", f"({info.layout_text()})"],
               example=f"1x{info.layout_text().replace('L', '126')}", ranks=(rank, rank + 1))


def parse_audio_latents(body: bytes, model: ModelState) -> tuple[np.ndarray, bool]:
    """The body's ``audio_latents`` ``(B, *layout)`` float32 (``(*layout)`` is one sound), and
    whether it had the batch dim: 422 for a layout the model's sound decoder does not take, a
    sound longer than ``max_audio_seconds``, or values that are not finite."""
    info = sound_of(model)
    array = parse_safetensors(body, check=partial(_check_rank, info=info), name=AUDIO_LATENTS)
    batched = array.ndim == len(info.layout) + 1
    sound = array if batched else array[None]
    sizes = sound.shape[1:]
    if any(size is not None and size != given for size, given in zip(info.layout, sizes, strict=True)):
        raise Problem(422, "invalid-audio-latents", f"audio latents {'x'.join(map(str, sizes))} do not fit the "
                      f"{info.title}: {info.latent_channels} channels, laid out {info.layout_text()} (L: latent frames)",
                      expected=f"(B, {info.layout_text()})", received=list(sound.shape))
    frames, limit = sizes[info.time_axis], model.limits.max_audio_seconds
    most = int(limit * info.latent_frames_per_second)
    if frames > most:
        raise Problem(422, "audio-too-long", f"{frames} audio latent frames are "
                      f"{frames / info.latent_frames_per_second:g} s of sound; this server decodes up to {limit:g} s",
                      expected=f"at most {most} audio latent frames", received=frames)
    check_finite(sound, "audio latents")
    return np.ascontiguousarray(sound, np.float32), batched


def check_sync(sound: np.ndarray, latents: np.ndarray, params: DecodeParams, model: ModelState) -> None:
    """422 unless the sound is as long as the video (the sync rule, give or take
    ``audio_sync_slack`` latent frames) and has as many rows."""
    info, limits = sound_of(model), model.limits
    if sound.shape[0] != latents.shape[0]:
        raise Problem(422, "audio-batch-mismatch", "the audio latents and the video latents have different batch sizes",
                      expected=latents.shape[0], received=sound.shape[0])
    video_frames = limits.output_frames(clip_shape(latents.shape)[2])
    expected = info.frames_for_video(video_frames, params.fps)
    given = sound.shape[1 + info.time_axis]
    if abs(given - expected) > limits.audio_sync_slack:
        slack = f" (±{limits.audio_sync_slack})" if limits.audio_sync_slack else ""
        raise Problem(422, "audio-out-of-sync", f"{video_frames} frames at {params.fps} fps last "
                      f"{video_frames / params.fps:g} s, which is {expected} audio latent frames at "
                      f"{info.latent_frames_per_second:g} per second; the audio latents have {given} "
                      "(the frame rate is the fps parameter)",
                      expected=f"{expected}{slack} audio latent frames", received=given)


def check_sound_answer(params: DecodeParams, batch: int) -> None:
    """422 for an answer that cannot carry the sound (a raw frame stream, an image, a tensor of
    frames), or a sound file of several rows. A fragmented MP4 stream carries it."""
    if (params.stream and not params.mp4_stream) or params.output_type not in SOUND_ANSWERS:
        received = "stream=true" if params.stream else f"output_type={params.output_type}"
        raise Problem(422, "invalid-parameter", "a decode with sound answers an MP4 with its soundtrack, or the "
                      "sound alone (wav, flac, npy)", expected=[f"output_type={t}" for t in SOUND_ANSWERS],
                      received=received)
    if params.output_type in ("mp4", *SOUND_FILES) and batch != 1:
        raise Problem(422, "batch-not-supported", f"{params.output_type} holds one sound: decode a batch as npy",
                      expected="batch size 1", received=batch)


def sound_body(waveforms: np.ndarray, params: DecodeParams, batched: bool,
               sample_rate: int) -> tuple[bytes, str, dict[str, str]]:
    """Waveforms ``(B, channels, samples)`` float32 → a WAV or FLAC file (16-bit) of the first,
    or npy of them all (float32; ``(channels, samples)`` for a body without the batch dim)."""
    headers = {"X-Sample-Rate": str(sample_rate)}
    if params.output_type == "npy":
        return npy_bytes(waveforms if batched else waveforms[0]), NPY_CONTENT_TYPE, headers
    write, media_type = SOUND_FILES[params.output_type]
    return write(waveforms[0], sample_rate), media_type, headers


def soundtrack(info: SoundInfo, bitrate: int) -> Callable[[np.ndarray], Sound]:
    """Waveforms ``(B, channels, samples)`` → the MP4 track of the first (B is 1 in an MP4)."""
    return lambda waveforms: Sound(waveforms[0], info.sample_rate, bitrate)


def sound_host_bytes(shape: tuple[int, ...], info: SoundInfo) -> int:
    """Host bytes of the sound of audio latents ``shape``: the latents, the float32 waveforms and
    their encoded copy (at most as large)."""
    samples = info.waveform_samples(shape[1 + info.time_axis])
    return 4 * int(np.prod(shape)) + 2 * 4 * shape[0] * info.channels * samples
