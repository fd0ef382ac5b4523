"""The HTTP API's schemas: request parameters, response bodies and the OpenAPI extras (what /docs shows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from vaeserve.models.shapes import Output

OutputType = Literal["mp4", "pt", "npy", "png", "jpeg", "pil", "wav", "flac"]  # wav, flac: a model's sound alone
# pil: an image file, its format from image_format (diffusers' remote_decode names JPEG "jpg").
ImageFormat = Literal["png", "jpg", "jpeg"]
EncodeOutputType = Literal["pt", "npy", "safetensors"]


@dataclass(frozen=True)
class DecodeParams:
    """Query parameters of ``POST /v1/decode`` after defaults and aliases are resolved."""

    output_type: OutputType
    denormalize: bool
    partial_postprocess: bool
    stream: bool
    mp4_stream: bool  # stream=true with output_type=mp4 asked for: fragmented MP4, not raw frames
    fps: int
    crf: int
    frame: int
    shape: tuple[int, ...] | None
    dtype: str | None
    scaling_factor: float | None
    shift_factor: float | None
    timeout_s: float
    framewise: bool = False  # HunyuanVideo 1.0: diffusers' default tiling in time instead of the whole clip
    image_format: ImageFormat = "png"  # of output_type=pil
    packed_size: tuple[int | None, int | None] = (None, None)  # (height, width) of Flux's packed latents
    # output_type=pil asked for a tensor (Accept: tensor/binary, as diffusers' client sends it with a
    # processor): the images or frames as float16 (N, 3, H, W) in [0, 1] instead of an image file.
    pil_tensor: bool = False
    # An LTX decoder's conditions (``models.decode.decode_conditions``); None: the checkpoint's
    # default (the seed: a fresh one, answered in X-Seed).
    timestep: float | None = None
    noise_scale: float | None = None
    seed: int | None = None

    @property
    def output(self) -> Output:
        """What the device produces: float only for ``pt`` tensors; uint8 frames otherwise
        (mp4, png, npy, ``pt`` with ``partial_postprocess``, streams)."""
        if self.output_type == "pt" and not self.partial_postprocess and not self.stream:
            return "float"
        return "uint8"

    @property
    def scaling(self) -> str:
        """How the latents were scaled, for the problems of values that came out non-finite."""
        return (f"scaling_factor={self.scaling_factor}, shift_factor={self.shift_factor}, "
                f"denormalize={str(self.denormalize).lower()}")

    @property
    def image_file(self) -> Literal["png", "jpeg"] | None:
        """The image format the answer is (one image, or one frame of a video), or None."""
        if self.output_type == "pil":
            return None if self.pil_tensor else "png" if self.image_format == "png" else "jpeg"
        return self.output_type if self.output_type in ("png", "jpeg") else None

    @property
    def one_video(self) -> bool:
        """The answer holds one video or image (B = 1): an MP4 (streamed or not) or an image file."""
        return self.mp4_stream or (not self.stream and (self.output_type == "mp4" or self.image_file is not None))


@dataclass(frozen=True)
class EncodeParams:
    """Query parameters of ``POST /v1/encode`` after defaults are resolved."""

    output_type: EncodeOutputType
    normalize: bool
    sample: bool
    seed: int | None
    shape: tuple[int, ...] | None
    dtype: str | None
    scaling_factor: float | None
    shift_factor: float | None
    timeout_s: float
    audio: bool = False  # encode the body's sound (a WAV, FLAC or MP4's track) to audio latents

    @property
    def scaling(self) -> str:
        """How the latents are scaled on the way out, for the problem of values that come out non-finite."""
        return f"scaling_factor={self.scaling_factor}, shift_factor={self.shift_factor}"


class Health(BaseModel):
    status: Literal["ok", "failed"]
    detail: str | None = None  # why it failed (a model that did not load, a multi-host slice that failed)


class Ready(BaseModel):
    status: str
    ready: bool
    detail: str | None = None


class MeshInfo(BaseModel):
    dp: int
    tp: int
    devices: list[str]
    processes: int = 1  # JAX processes (hosts) the mesh spans
    # How its programs' convolutions are compiled: "matmul" or "onednn" on CPU (--cpu-convs), "native" elsewhere.
    convs: Literal["matmul", "onednn", "native"]


class WarmedShape(BaseModel):
    shape: list[int]
    outputs: list[str]


class LatentsInfo(BaseModel):
    """What the loaded model takes and gives, and the largest request served (from its config)."""

    # An image model (SD, SDXL, Flux.1, Flux.2, Qwen-Image): latents (B, C, H, W) without a time
    # axis, images out; temporal_scale and max_latent_frames are then None.
    is_image: bool
    layout: str  # of the latents: "(B, C, T, H, W)" or "(B, C, H, W)"
    channels: int  # latent channels C: 16 (Wan 2.1, HunyuanVideo, Flux.1), 48 (Wan 2.2), 32 (HunyuanVideo 1.5, Flux.2), 4 (SD, SDXL)
    spatial_scale: int  # output pixels per latent row/column: 8 (Wan 2.1, HunyuanVideo, the image models), 16 (Wan 2.2, HunyuanVideo 1.5)
    temporal_scale: int | None  # output frames per latent frame after the first (4)
    # denormalize (diffusers' do_scaling): z · latents_std + latents_mean per channel. Wan: its
    # published statistics; HunyuanVideo: 0 and 1 / scaling_factor (pipelines divide by it).
    latents_mean: list[float]
    latents_std: list[float]
    # True: a stream sends each step's frames as it is decoded. False (HunyuanVideo 1.0, whose
    # statistics span the clip): the whole clip is decoded before the first chunk is sent.
    causal: bool
    framewise: bool  # framewise=true offered: diffusers' default tiling in time (HunyuanVideo 1.0)
    max_batch: int
    max_latent_frames: int | None  # largest T with 1 + temporal_scale (T - 1) ≤ max_frames
    max_latent_height: int  # largest H with spatial_scale H ≤ max_height
    max_latent_width: int
    max_height: int  # of the output, in pixels
    max_width: int


class ConditionsInfo(BaseModel):
    """What a decoder that takes conditions (LTX-Video 0.9.1+, LTX-2) takes with its latents: the
    query parameters ``timestep``, ``noise_scale`` (timestep-conditioned decoders) and ``seed``."""

    timestep_conditioned: bool  # takes timestep and noise_scale
    injects_noise: bool  # its resnets add seeded noise: the seed changes every answer
    default_timestep: float | None  # the checkpoint's pipeline's decode_timestep, else 0.05 (None: takes none)
    default_noise_scale: float | None  # the pipeline's decode_noise_scale, else 0
    timestep_range: list[float]  # [low, high], both included
    seed_range: list[int]  # [0, 2**32): the seed is an integer in it


class ProgramMemory(BaseModel):
    """Per-device bytes of one compiled program (``memory_analysis()``)."""

    program: str
    shape: list[int]
    variant: str
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    code_bytes: int
    total_bytes: int


class VideoSize(BaseModel):
    """A video's size and the bytes per device its programs need (estimated)."""

    width: int
    height: int
    frames: int
    bytes: int


class MemoryInfo(BaseModel):
    """The memory this server runs in and how it is shared out (docs: serving, "No out-of-memory
    surprises"), and the largest videos it can decode and encode with it, by the estimate from the
    model's shape rules (empty where the family has none: programs are then checked once compiled)."""

    device_bytes: int | None  # what every program must fit per device (None: unknown, not checked)
    device_source: str  # --device-memory-bytes, the devices' bytes_limit, or the host's memory (CPU)
    host_bytes: int  # the host account: what requests hold on the host at most, together
    machine_bytes: int | None  # the host's memory (cgroup limit or MemTotal) where read
    machine_source: str | None
    reserve_bytes: int
    largest_decode: list[VideoSize]  # at the most frames served: the largest frame; at the largest frame: the most frames
    largest_encode: list[VideoSize]


class SoundDescription(BaseModel):
    """A model's sound decoder (docs/audio.md): its latents ``(B, *latent_layout)`` (``L``: latent
    frames) decode to ``channels`` at ``sample_rate``, ``samples_per_latent_frame`` each; where it
    ``encodes``, the same sound encodes to them."""

    title: str
    sample_rate: int
    channels: int
    latent_channels: int
    latent_layout: str
    samples_per_latent_frame: int
    latent_frames_per_second: float
    encodes: bool  # it has an encoder: POST /v1/encode turns a WAV, FLAC or MP4's sound into its latents


class ModelInfo(BaseModel):
    id: str
    source: str | None
    random_weights: bool | None
    dtype: str
    encodes: bool  # the checkpoint has an encoder: POST /v1/encode serves (else 501 no-encoder)
    latents: LatentsInfo
    # The conditions the decoder takes (query parameters of POST /v1/decode); None: it takes none.
    decode_conditions: ConditionsInfo | None
    config: dict[str, Any]
    metadata: dict[str, Any]
    mesh: MeshInfo
    batch_buckets: list[int]
    warmed_shapes: list[list[int]]
    warmed: list[WarmedShape]
    compiled: list[list[Any]]
    program_memory: list[ProgramMemory]
    device_memory_bytes: int | None  # what every program is checked against per device (None: unknown, no check)
    memory: MemoryInfo | None
    sound: SoundDescription | None = None  # its sound decoder (audio_latents beside the latents); None: no sound


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelInfo]


class ProblemDocument(BaseModel):
    """RFC 9457 problem details (``application/problem+json``), as ``service.problem.Problem`` renders."""

    type: str
    title: str
    status: int
    detail: str
    instance: str
    request_id: str | None = None
    expected: Any = None
    received: Any = None


# ---- OpenAPI: what /docs and schema-driven clients (and fuzzers) see -----------------------------

_BINARY = {"schema": {"type": "string", "format": "binary"}}

PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"description": description, "content": {"application/problem+json": {"schema": ProblemDocument.model_json_schema()}}}
    for code, description in {
        400: "malformed request headers", 401: "API key set and the bearer token missing or wrong",
        408: "the body did not arrive in time", 413: "body over max_body_bytes",
        404: "the model named (model=, /v1/models/{name}/...) is not served here",
        415: "Content-Type not a format of this route",
        422: "the body or a parameter is invalid, the request cannot fit this server's memory, or it names no "
             "model of a server of several",
        429: "queue full, or too many body bytes being read", 500: "the decode or encode failed",
        501: "encode asked of a checkpoint without an encoder",
        503: "loading, draining or failed; the host memory for requests stayed in use until the deadline; "
             "out of memory while the program ran", 504: "no result within the deadline",
    }.items()
}

# The formats of the request body (docs/api.md, "Routes"); raw bodies need ?shape=&dtype=.
DECODE_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "latents (B, C, T, H, W) or (C, T, H, W); an image model's (B, C, H, W), (C, H, W) or Flux's "
        "packed (B, H·W/4, 4C) with height and width; C: the model's latent channels (/v1/models). A model with "
        "sound: a safetensors body with the tensors latents and audio_latents (docs/audio.md)",
        "content": {media: _BINARY for media in (
            "application/octet-stream", "tensor/binary", "application/x-npy", "application/x-safetensors")},
    }
}

DECODE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "by output_type: video/mp4, application/x-npy, image/png, image/jpeg (pil: by image_format), "
        "application/octet-stream (pt), audio/wav, audio/flac; application/x-vaeserve-stream with stream=true",
        "content": {media: _BINARY for media in (
            "video/mp4", "application/x-npy", "image/png", "image/jpeg", "application/octet-stream",
            "application/x-vaeserve-stream", "audio/wav", "audio/flac")},
    },
    **PROBLEM_RESPONSES,
}

# POST /v1/encode (docs/api.md, "Encoding"): frames in, latents out. No Content-Type at all is accepted too.
ENCODE_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "an image (PNG/JPEG), an MP4, or frames (B, 3, F, H, W) / (B, 3, H, W) in [-1, 1]; "
        "or a sound to audio latents: a WAV or FLAC file, or an MP4 with audio=true",
        "content": {media: _BINARY for media in (
            "image/png", "image/jpeg", "video/mp4", "application/octet-stream", "tensor/binary",
            "application/x-npy", "application/x-safetensors", "audio/wav", "audio/flac")},
    }
}

ENCODE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "float32 latents (B, z, T, H/s, W/s) (an image model's (B, z, H/s, W/s); s = 8 for Wan 2.1 "
        "and the image models, 16 for Wan 2.2), or a sound's audio latents (1, *sound.latent_layout): raw bytes "
        "with shape/dtype headers (pt), .npy or safetensors",
        "content": {media: _BINARY for media in (
            "application/octet-stream", "application/x-npy", "application/x-safetensors")},
    },
    **PROBLEM_RESPONSES,
}
