"""Every knob of the service, in one pydantic-settings class.

Build it inside the app factory or the CLI (``Settings()``), never at import time, so tests and
embedders can make their own. Environment variables use the prefix ``VAESERVE_`` (for example
``VAESERVE_MAX_QUEUE=64``); lists such as ``warmup`` are given as JSON in the environment
(``VAESERVE_WARMUP='["16x21x60x104"]'``) or repeated on the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from vaeserve.models.registry import embedded_names_text, models_in_words
from vaeserve.models.shapes import parse_shape_text, shape_text

# Shapes without the batch dim: a video model's latents (C, T, H, W) and frames (3, F, H, W); an
# image model's latents (C, H, W) and images (3, H, W).
LatentShape = tuple[int, ...]
FrameShape = tuple[int, ...]
# What a warm-up compiles for a shape: the uint8 frames (mp4, png, npy, pt + partial_postprocess),
# the float tensor (pt) and the step programs of stream=true — every one by default — and, only
# where named, HunyuanVideo 1.0's framewise decode (framewise=true: its uint8 frames and float tensor).
WarmupOutput = Literal["uint8", "float", "stream", "framewise"]
WARMUP_OUTPUTS: tuple[WarmupOutput, ...] = ("uint8", "float", "stream")
# Video codecs an encode may send in an MP4/MOV (FFmpeg's names); each one enabled is a decoder
# that runs on clients' bytes, so only the common ones are on by default.
VideoCodec = Literal["h264", "hevc", "mpeg4", "av1", "vp9"]
DEFAULT_VIDEO_CODECS: tuple[VideoCodec, ...] = ("h264", "hevc", "mpeg4")

def parse_latent_shape(text: str | tuple | list) -> LatentShape:
    """``"16x21x60x104"`` (or ``"16,21,60,104"``, or a sequence) -> ``(16, 21, 60, 104)``; an image
    model's ``"16x128x128"`` -> ``(16, 128, 128)``."""
    return _dims(text, "a latent shape CxTxHxW (e.g. 16x21x60x104), or an image model's CxHxW (e.g. 16x128x128)")


def parse_frame_shape(text: str | tuple | list) -> FrameShape:
    """``"3x81x480x832"`` (or ``"3,81,480,832"``, or a sequence) -> ``(3, 81, 480, 832)``; an image
    model's ``"3x1024x1024"`` -> ``(3, 1024, 1024)``."""
    return _dims(text, "a frame shape 3xFxHxW (e.g. 3x81x480x832), or an image model's 3xHxW (e.g. 3x1024x1024)")


def _dims(text: str | tuple | list, what: str) -> tuple[int, ...]:
    """Three or four dims (which the model takes is checked when it is loaded)."""
    if isinstance(text, (tuple, list)):
        text = shape_text([int(v) for v in text])
    return parse_shape_text(text, (3, 4), what)


class Warmup(BaseModel):
    """One ``--warmup`` entry: a latent shape and the outputs to compile for it."""

    model_config = ConfigDict(frozen=True)

    shape: LatentShape
    outputs: tuple[WarmupOutput, ...] = WARMUP_OUTPUTS

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        """``"16x21x60x104"`` (every output) or ``"16x21x60x104:uint8,stream"``; a bare shape
        sequence is accepted too."""
        if isinstance(value, str):
            shape, _, outputs = value.partition(":")
            parsed: dict[str, Any] = {"shape": parse_latent_shape(shape)}
            if outputs.strip():
                parsed["outputs"] = tuple(part.strip() for part in outputs.split(","))
            return parsed
        if isinstance(value, (tuple, list)):
            return {"shape": parse_latent_shape(value)}
        return value

    def __str__(self) -> str:
        return "x".join(map(str, self.shape)) + ":" + ",".join(self.outputs)

    def outputs_for(self, *, images: bool) -> tuple[WarmupOutput, ...]:
        """The outputs compiled for this entry: an image is answered whole (no stream), so an image
        model's default (every output) is its uint8 and float decodes; a stream named for one is an
        error (``ValueError``)."""
        if not images or "stream" not in self.outputs:
            return self.outputs
        if self.outputs != WARMUP_OUTPUTS:
            raise ValueError(f"--warmup {self}: an image model decodes whole images (no stream); warm up uint8 and "
                             "float")
        return tuple(output for output in self.outputs if output != "stream")


SECTIONS = {
    "model": "Model and mesh",
    "slice": "Multi-host slice (one process per host; process 0 serves requests)",
    "network": "Network",
    "scheduling": "Scheduling",
    "limits": "Input limits (checked before any device work)",
    "memory": "Memory (every program and every request checked against it before it runs)",
    "output": "Output defaults",
    "host": "Host work: streams and MP4 encoding",
}


def _in(section: str, metavar: str | None = None) -> dict[str, Any]:
    """A setting's place in ``vaeserve serve --help`` and the docs' table (``json_schema_extra``)."""
    return {"section": section, **({"metavar": metavar} if metavar else {})}


class Settings(BaseSettings):
    """Service configuration, declared once: ``vaeserve serve --help``, the ``VAESERVE_*``
    environment variables and the docs' settings table are all made from these fields. Defaults
    suit one host with a handful of accelerators."""

    model_config = SettingsConfigDict(env_prefix="VAESERVE_", extra="ignore", protected_namespaces=())

    # --- model and mesh -------------------------------------------------------------------
    model: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description=f"diffusers-format VAE folder (or a pipeline folder with vae/) of "
        f"{models_in_words()}, a .safetensors file, an original release's checkpoint (Wan2.x_VAE.pth, HunyuanVideo's "
        "vae/pytorch_model.pt, Lightricks' single files), or an embedded model with random weights: "
        f"{embedded_names_text()}; repeatable: one server for several models, each request naming its own by its "
        "id in /v1/models (NAME=PATH names one, else the id is the value as given; in the environment a JSON "
        "list); none: the embedded default",
        json_schema_extra=_in("model", "PATH|NAME"))
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="weights and activations (float32 matches the PyTorch reference)",
        json_schema_extra=_in("model"))
    cpu_convs: Literal["matmul", "onednn"] = Field(
        "onednn", description="how a CPU runs the convolutions: onednn (XLA's oneDNN convolutions; decodes "
        "1.2-1.3x faster than matmul on x86-64 with AVX-512) or matmul (nine-tap matmuls only); the memory "
        "estimate has coefficients for each; accelerators ignore it",
        json_schema_extra=_in("model"))
    tp: int = Field(1, ge=1, description="devices per frame (horizontal bands)", json_schema_extra=_in("model", "N"))
    dp: int = Field(1, ge=1, description="data-parallel replicas; batches are padded to a multiple",
                    json_schema_extra=_in("model", "N"))
    cpu_devices: int | None = Field(
        None, ge=1, description="fake this many CPU devices (testing tp/dp without accelerators)",
        json_schema_extra=_in("model", "N"))
    warmup: list[Warmup] = Field(
        default_factory=list,
        description="latent shape compiled before /readyz is 200 (repeatable); outputs: uint8, float, stream "
        "(default all three; an image model's: uint8 and float), framewise (HunyuanVideo 1.0's framewise=true), "
        "e.g. 16x21x60x104 or 16x21x60x104:uint8,stream; an image model's CxHxW, e.g. 16x128x128",
        json_schema_extra=_in("model", "CxTxHxW|CxHxW[:OUTPUTS]"))
    encode_warmup: list[FrameShape] = Field(
        default_factory=list,
        description="frame shape whose encode is compiled before /readyz is 200 (repeatable; needs an encoder), "
        "e.g. 3x81x480x832; an image model's 3xHxW, e.g. 3x1024x1024", json_schema_extra=_in("model", "3xFxHxW|3xHxW"))
    compile_cache: str | None = Field(
        None, description="JAX persistent compilation cache directory: a restart reuses the programs compiled "
        "before, but for those of oneDNN's convolutions (--cpu-convs onednn), which XLA cannot save",
        json_schema_extra=_in("model", "DIR"))
    embedded_weights_cache: str | None = Field(
        None, description="folder where an embedded model keeps the random weights it draws (a subfolder such as "
        "wan2.1-random-weights-seed0), read back at the next start instead of drawn again; default: drawn at "
        "every start", json_schema_extra=_in("model", "DIR"))
    shapes: list[LatentShape] | Literal["any", "warmed"] = Field(
        "any", description="latent shapes served (repeatable): any, warmed (the warm-up shapes and outputs only), "
        "or a list; others get 422. Unless any, encode serves only the encode-warmup frame shapes",
        json_schema_extra=_in("model", "any|warmed|CxTxHxW|CxHxW"))
    max_programs: int = Field(
        64, ge=0, description="compiled programs kept (least recently used dropped); 0 = no limit",
        json_schema_extra=_in("model", "N"))
    tile_size: int | None = Field(
        None, ge=1, description="a tiled decode and encode (MiniMax-H3): the side of its square spatial tiles in "
        "pixels, a multiple of the model's spatial scale (16); default: the model's release (256). The released "
        "frames are those of its own tiles: another size decodes another picture; models without tiles ignore it",
        json_schema_extra=_in("model", "PIXELS"))
    tile_overlap: int | None = Field(
        None, ge=1, description="a tiled decode and encode (MiniMax-H3): the least overlap of neighbouring tiles in "
        "pixels, widened so the tiles cover the frame exactly; a multiple of the spatial scale below tile-size; "
        "default: the model's release (64)", json_schema_extra=_in("model", "PIXELS"))
    tiles_per_step: int | None = Field(
        None, ge=1, description="a tiled decode and encode (MiniMax-H3): tiles each device runs at once (more: "
        "fewer steps and more memory; the same frames); default: the model's (4)", json_schema_extra=_in("model", "N"))
    # --- multi-host slice (one process per host; process 0 serves requests) ----------------
    distributed: Literal["off", "auto"] = Field(
        "off", description="auto: join a multi-host slice, JAX detecting what is not given (TPU VMs, GKE)",
        json_schema_extra=_in("slice"))
    coordinator_address: str | None = Field(None, description="HOST:PORT of process 0's coordinator (all processes)",
                                            json_schema_extra=_in("slice", "HOST:PORT"))
    num_processes: int | None = Field(None, ge=1, description="processes in the slice, one per host",
                                      json_schema_extra=_in("slice", "N"))
    process_id: int | None = Field(None, ge=0, description="this process's rank; 0 serves requests",
                                   json_schema_extra=_in("slice", "N"))
    heartbeat_timeout_s: int = Field(
        10, ge=1, description="a process silent this long is dead: the slice fails (process 0 exits 3)",
        json_schema_extra=_in("slice", "SECONDS"))
    call_timeout_s: float = Field(
        600.0, gt=0, description="a device call unfinished on the slice after this fails the slice",
        json_schema_extra=_in("slice", "SECONDS"))
    failure_grace_s: float = Field(
        2.0, ge=0, description="after the slice fails, process 0 answers 503 this long, then exits 3",
        json_schema_extra=_in("slice", "SECONDS"))

    # --- network --------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0: every interface)",
                      json_schema_extra=_in("network", "ADDRESS"))
    port: int = Field(8000, ge=0, le=65535, description="port to listen on", json_schema_extra=_in("network", "PORT"))
    api_key: SecretStr | None = Field(
        None, description="if set, require 'Authorization: Bearer KEY' on /v1/*; an empty key is refused at start-up. "
        "Given as this flag, the key is in the process's command line, which every local user can read "
        "(/proc/PID/cmdline): prefer the environment variable or api-key-file",
        json_schema_extra=_in("network", "KEY"))
    api_key_file: Path | None = Field(
        None, description="file holding the API key (whitespace around it is stripped; an empty file is refused), "
        "instead of api-key", json_schema_extra=_in("network", "PATH"))
    log_level: str = Field("info", description="debug, info, warning or error", json_schema_extra=_in("network", "LEVEL"))
    max_connections: int = Field(
        256, ge=1, description="open connections (and requests in progress); past it uvicorn answers 503",
        json_schema_extra=_in("network", "N"))
    keepalive_timeout_s: int = Field(5, ge=1, description="an idle keep-alive connection is closed after this",
                                     json_schema_extra=_in("network", "SECONDS"))
    read_timeout_s: float = Field(
        30.0, gt=0, description="time to receive a request's headers, and again its body; past it 408",
        json_schema_extra=_in("network", "SECONDS"))
    upload_stall_s: float = Field(
        10.0, gt=0, description="a request body from which no byte arrives for this long is cut (408 upload-stalled, "
        "connection closed); read-timeout-s bounds the whole body", json_schema_extra=_in("network", "SECONDS"))
    write_timeout_s: float = Field(
        30.0, gt=0, description="a client that takes none of its answer for this long while the server has bytes "
        "for it is dropped (connection closed, counted as 499); any byte taken restarts the clock",
        json_schema_extra=_in("network", "SECONDS"))

    # --- scheduling -----------------------------------------------------------------------
    max_queue: int = Field(16, ge=1, description="requests waiting for the device; more get 429",
                           json_schema_extra=_in("scheduling", "N"))
    max_batch: int = Field(4, ge=1, description="inputs run together on the device (also the per-request B limit)",
                           json_schema_extra=_in("scheduling", "N"))
    request_timeout_s: float = Field(
        300.0, gt=0, description="deadline from arrival, unless the request asks for another with timeout_s; past "
        "it 504, and a decode stops at its next step", json_schema_extra=_in("scheduling", "SECONDS"))
    max_request_timeout_s: float = Field(
        3600.0, gt=0, description="the longest deadline a request may ask for with timeout_s (a big video on a "
        "slow host asks for time instead of getting 504)", json_schema_extra=_in("scheduling", "SECONDS"))
    retry_after_s: int = Field(1, ge=0, description="Retry-After sent with 429 and 503",
                               json_schema_extra=_in("scheduling", "SECONDS"))
    drain_timeout_s: float = Field(
        60.0, ge=0, description="on SIGTERM or SIGINT: time to finish queued and running work; what is left then is "
        "answered 503 (a second signal ends it at once)", json_schema_extra=_in("scheduling", "SECONDS"))

    # --- input limits (checked before any device work) ------------------------------------
    max_body_bytes: int = Field(64 * 2**20, ge=1, description="Content-Length above this gets 413",
                                json_schema_extra=_in("limits", "BYTES"))
    max_reading_bytes: int = Field(
        256 * 2**20, ge=1, description="bytes of request bodies being read at once; past it 429",
        json_schema_extra=_in("limits", "BYTES"))
    max_frames: int = Field(129, ge=1, description="output frames per video, 1 + 4 (T - 1)",
                            json_schema_extra=_in("limits", "N"))
    max_height: int = Field(1280, ge=8, description="output height in pixels, s·H (s: the model's spatial scale)",
                            json_schema_extra=_in("limits", "PIXELS"))
    max_width: int = Field(1280, ge=8, description="output width in pixels, s·W", json_schema_extra=_in("limits", "PIXELS"))
    video_codecs: list[VideoCodec] = Field(
        default_factory=lambda: list(DEFAULT_VIDEO_CODECS),
        description="codecs read from MP4/MOV encode bodies (repeatable): h264, hevc, mpeg4 (MPEG-4 Part 2), av1, "
        "vp9; others get 415", json_schema_extra=_in("limits", "CODEC"))

    # --- memory ---------------------------------------------------------------------------
    device_memory_bytes: int | None = Field(
        None, ge=1, description="memory per device that every program (warm-up or compiled for a request) must fit "
        "before it runs; default: the devices' memory_stats()['bytes_limit'] on TPU/GPU, on CPU what the host "
        "account and the reserve leave of the host's memory, shared by the mesh's devices",
        json_schema_extra=_in("memory", "BYTES"))
    host_memory_bytes: int | None = Field(
        None, ge=1, description="host memory for what requests hold: decoded encode inputs, decoded frames "
        "waiting to be written, MP4/npy answers, stream buffers; a request that would overdraw it waits up to its "
        "deadline, then 503; default: a quarter of the host's memory after the reserve on CPU (the devices' "
        "programs run in the rest), half on TPU/GPU hosts", json_schema_extra=_in("memory", "BYTES"))
    host_reserve_bytes: int = Field(
        2 * 2**30, ge=0, description="host memory kept for the process itself (Python, JAX's runtime, the weights "
        "as read, the compiler), taken off the host's memory (its cgroup limit, else MemTotal) before the rest is "
        "shared out", json_schema_extra=_in("memory", "BYTES"))
    max_decoded_bytes: int | None = Field(
        None, ge=1, description="deprecated: the former name of host-memory-bytes (read for one more release)",
        json_schema_extra=_in("memory", "BYTES"))

    # --- output defaults ------------------------------------------------------------------
    default_fps: int = Field(16, ge=1, le=240, description="frame rate of MP4 answers without fps=",
                             json_schema_extra=_in("output", "FPS"))
    default_crf: int = Field(18, ge=0, le=51, description="libx264 quality of MP4 answers without crf= (0: lossless)",
                             json_schema_extra=_in("output", "CRF"))

    # --- sound (a model with a sound decoder: docs/audio.md) --------------------------------------
    max_audio_seconds: float = Field(60.0, gt=0, description="longest sound a decode takes: its audio latents' "
                                     "frames over the decoder's latent frames per second",
                                     json_schema_extra=_in("limits", "SECONDS"))
    audio_sync_slack: int = Field(1, ge=0, description="audio latent frames a request's sound may differ from "
                                  "round(frames / fps x latent frames per second), its video's length",
                                  json_schema_extra=_in("limits", "FRAMES"))
    audio_bitrate: int = Field(192_000, ge=32_000, le=512_000, description="AAC bit rate of the sound of MP4 answers, "
                               "bits per second", json_schema_extra=_in("output", "BPS"))

    # --- host work: streams and MP4 encoding ---------------------------------------------------
    mp4_writers: int | None = Field(
        None, ge=1, description="H.264 encodes run at once, each in a thread (PyAV releases the GIL while it "
        "encodes); an MP4 answer holds one only while it encodes, its frames waiting meanwhile within "
        "stream-buffer-bytes; default: the host's cores", json_schema_extra=_in("host", "N"))
    encode_workers: int | None = Field(
        None, ge=1, description="deprecated: the former name of mp4-writers (read for one more release)",
        json_schema_extra=_in("host", "N"))
    stream_buffer_bytes: int = Field(
        64 * 2**20, ge=1, description="decoded frames a stream or an MP4 request may hold for its reader or encoder; "
        "past it the device serves other requests until they are taken (about one decode step more may arrive); "
        "held in host-memory-bytes from admission", json_schema_extra=_in("host", "BYTES"))
    slow_reader_s: float = Field(
        30.0, gt=0, description="a stream whose reader has left its buffer full this long is ended (in-band "
        "slow-reader problem) when others need what it holds: its batch-mates the device, or waiting requests the "
        "device memory of its decode state", json_schema_extra=_in("host", "SECONDS"))
    max_buffered_bytes: int | None = Field(
        None, ge=1, description="deprecated and ignored: every stream and MP4 request holds its stream-buffer-bytes "
        "in host-memory-bytes, which bounds them all together (read for one more release)",
        json_schema_extra=_in("host", "BYTES"))

    @field_validator("model", mode="before")
    @classmethod
    def _model_list(cls, value: Any) -> Any:
        # One model as a plain string (VAESERVE_MODEL=/models/wan, Settings(model="wan2.1")), several
        # as a list (repeated --model, a JSON list in the environment).
        if value is None:
            return []
        if isinstance(value, str):
            return json.loads(value) if value.lstrip().startswith("[") else [value]
        return value

    @model_validator(mode="after")
    def _model_names_differ(self) -> Settings:
        names = [named_model(entry)[0] for entry in self.model]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"two models are named alike (--model): {', '.join(repeated)}; name them (NAME=PATH)")
        if len(self.model) > 1 and self.multi_process:
            raise ValueError("a multi-host slice serves one model: give --model once")
        return self

    @field_validator("warmup", mode="before")
    @classmethod
    def _split_warmup(cls, value: Any) -> Any:
        if isinstance(value, str):  # "16x2x4x4;16x1x8x8:uint8"
            value = [part for part in value.split(";") if part.strip()]
        return value

    @field_validator("encode_warmup", mode="before")
    @classmethod
    def _parse_encode_warmup(cls, value: Any) -> Any:
        if isinstance(value, str):  # "3x5x64x64;3x1x64x64"
            value = [part for part in value.split(";") if part.strip()]
        if isinstance(value, (list, tuple)):
            return [parse_frame_shape(v) for v in value]
        return value

    @field_validator("shapes", mode="before")
    @classmethod
    def _parse_shapes(cls, value: Any) -> Any:
        # --shapes warmed / --shapes 16x21x60x104 --shapes ... / VAESERVE_SHAPES=warmed or a JSON list
        if isinstance(value, (list, tuple)) and len(value) == 1 and value[0] in ("any", "warmed"):
            return value[0]
        if isinstance(value, (list, tuple)):
            return [parse_latent_shape(v) for v in value]
        return value

    @property
    def multi_process(self) -> bool:
        """True when this process is one of a multi-host slice."""
        return self.distributed == "auto" or any(
            value is not None for value in (self.coordinator_address, self.num_processes, self.process_id))

    @model_validator(mode="after")
    def _slice_is_complete(self) -> Settings:
        given = {"coordinator_address": self.coordinator_address, "num_processes": self.num_processes,
                 "process_id": self.process_id}
        missing = [name for name, value in given.items() if value is None]
        if self.distributed == "off" and missing and len(missing) < len(given):
            raise ValueError(f"a multi-host slice needs coordinator_address, num_processes and process_id "
                             f"(or distributed=auto); missing: {', '.join(missing)}")
        if self.num_processes is not None and self.process_id is not None and self.process_id >= self.num_processes:
            raise ValueError(f"process_id must be below num_processes ({self.num_processes}); received {self.process_id}")
        return self

    @property
    def mp4_writer_count(self) -> int:
        """``mp4_writers``, or the cores this process may run on."""
        if self.mp4_writers is not None:
            return self.mp4_writers
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

    @model_validator(mode="after")
    def _deprecated_names(self) -> Settings:
        if self.encode_workers is not None:
            warnings.warn("encode_workers (--encode-workers, VAESERVE_ENCODE_WORKERS) is now mp4_writers; the old "
                          "name is read for one more release", DeprecationWarning, stacklevel=2)
            if self.mp4_writers is None:
                self.mp4_writers = self.encode_workers
        if self.max_decoded_bytes is not None:
            warnings.warn("max_decoded_bytes (--max-decoded-bytes, VAESERVE_MAX_DECODED_BYTES) is now "
                          "host_memory_bytes, one account for everything requests hold on the host; the old name "
                          "is read for one more release", DeprecationWarning, stacklevel=2)
            if self.host_memory_bytes is None:
                self.host_memory_bytes = self.max_decoded_bytes
        if self.max_buffered_bytes is not None:
            warnings.warn("max_buffered_bytes (--max-buffered-bytes, VAESERVE_MAX_BUFFERED_BYTES) is ignored: "
                          "every stream's buffer is held in host_memory_bytes", DeprecationWarning, stacklevel=2)
        return self

    @model_validator(mode="after")
    def _usable_api_key(self) -> Settings:
        # An empty key (an unset variable in a compose file gives one) would make the empty bearer
        # token the key: auth that anyone passes. A key with whitespace around it no client can send.
        if self.api_key_file is not None:
            if self.api_key is not None:
                raise ValueError("the API key is given twice: set api_key or api_key_file, not both")
            self.api_key = SecretStr(read_key_file(self.api_key_file))
        if self.api_key is not None:
            key = self.api_key.get_secret_value()
            if not key.strip():
                raise ValueError("the API key (--api-key, VAESERVE_API_KEY) is empty: set a key, or leave it unset to "
                                 "serve without one")
            if key != key.strip():
                raise ValueError("the API key begins or ends with whitespace, which no Authorization header "
                                 "carries: remove it")
        return self

    @property
    def timeout_cap_s(self) -> float:
        """The longest deadline a request may ask for: ``max_request_timeout_s``, never below the default."""
        return max(self.max_request_timeout_s, self.request_timeout_s)

    @model_validator(mode="after")
    def _body_fits_reading_budget(self) -> Settings:
        # A body of max_body_bytes could otherwise never be admitted.
        if self.max_reading_bytes < self.max_body_bytes:
            raise ValueError(f"max_reading_bytes ({self.max_reading_bytes}) must be at least max_body_bytes "
                             f"({self.max_body_bytes})")
        return self


# ``--model NAME=SOURCE``: a name a URL's path carries as it is.
_NAMED_MODEL = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)=(?P<source>.+)")


def named_model(entry: str) -> tuple[str, str]:
    """A ``--model`` entry's name and source: ``wan=/models/wan2.1-vae`` serves that folder as
    ``wan``; a bare source (an embedded model's name, a path) is its own name."""
    named = _NAMED_MODEL.fullmatch(entry)
    return (named["name"], named["source"]) if named else (entry, entry)


def read_key_file(path: Path) -> str:
    """The API key in ``path``, whitespace around it stripped (an editor's final newline); ``ValueError``
    for a file that cannot be read or holds no key."""
    try:
        key = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"api_key_file {path} cannot be read: {exc}") from None
    if not key:
        raise ValueError(f"api_key_file {path} holds no key (it is empty, or whitespace only)")
    return key


def add_argument(parser: argparse.ArgumentParser, name: str, flag: str | None = None) -> None:
    """The setting ``name`` as a flag of another command (the offline ``decode``/``encode``): its
    type, choices, default and help from its one declaration here; ``flag`` renames it
    (``--fps`` for ``default_fps``)."""
    field = Settings.model_fields[name]
    annotation = field.annotation
    choices = list(get_args(annotation)) if get_origin(annotation) is Literal else None
    kind = next((t for t in (int, float) if annotation in (t, t | None)), str)
    default = field.get_default(call_default_factory=True)
    # A repeatable setting (--model) is taken once by a command of one model: none given, its default is None.
    parser.add_argument(flag or "--" + name.replace("_", "-"), dest=name, type=kind,
                        default=None if isinstance(default, list) else default, choices=choices, help=field.description)


def _default_text(name: str) -> str:
    default = Settings.model_fields[name].get_default(call_default_factory=True)
    if default is None or default == []:
        return "none"
    if isinstance(default, list):
        return ", ".join(f"`{value}`" for value in default)
    return f"`{default}`"


def settings_markdown() -> str:
    """The docs' settings table, section by section: flag, environment variable, default, meaning."""
    lines: list[str] = []
    for section, title in SECTIONS.items():
        lines += [f"### {title}", "", "| flag | environment | default | meaning |", "|---|---|---|---|"]
        for name, field in Settings.model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if extra.get("section") != section:
                continue
            flag = "--" + name.replace("_", "-")
            metavar = extra.get("metavar")
            if metavar is None and get_origin(field.annotation) is Literal:
                metavar = "|".join(get_args(field.annotation))  # the choices, as the docs write them
            flag_text = (f"`{flag} {metavar}`" if metavar else f"`{flag}`").replace("|", "\\|")
            meaning = (field.description or "").replace("|", "\\|")  # a table cell
            lines.append(f"| {flag_text} | `VAESERVE_{name.upper()}` | {_default_text(name)} | {meaning} |")
        lines.append("")
    return "\n".join(lines)
