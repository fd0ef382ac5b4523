"""``RemoteVAE``: a served VAE that a diffusers pipeline takes as its own ``vae``.

    pipe = WanPipeline.from_pretrained("Wan-AI/Wan2.1-T2V-14B-Diffusers", vae=None)
    pipe = WanPipeline(**{**pipe.components, "vae": RemoteVAE("http://127.0.0.1:8000")})
    pipe.vae = RemoteVAE("http://127.0.0.1:8000")     # or swapped into a pipeline built with its VAE

It answers what pipelines read of their VAE — ``config`` (the served model's diffusers config, from
``GET /v1/models``), ``dtype``, ``device``, ``latents_mean``/``latents_std``, the compression
ratios — and its ``decode``/``encode`` return diffusers' own output classes, so the pipeline's code
runs unchanged. It holds no weights and is not a ``torch.nn.Module``: ``pipe.to(...)`` and CPU
offloading pass it by, as they should pass a model that lives on another machine.

Needs torch and diffusers (the ``pipelines`` extra), imported when a ``RemoteVAE`` is built: the
module itself imports without them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .http import decode as decode_latents, encode as encode_frames, served_models

if TYPE_CHECKING:
    import torch

# What a decode answer carries: float16 frames in [-1, 1] (2 bytes a value), or uint8 frames
# (1 byte a value) that the pipeline's own post-processing turns back into the same uint8 levels.
FrameTransfer = Literal["float16", "uint8"]
SEED_BOUND = 2**32  # the server's seed range, [0, 2³²)


class RemoteVAE:
    """The model ``model`` served at ``url`` (the base URL, e.g. ``http://127.0.0.1:8000``), as a
    pipeline's VAE. ``model``: the ``id`` in ``GET /v1/models`` (None: the one the server serves).

    ``frames``: what a decode answer carries. ``"float16"`` (the default) suits every output type;
    ``"uint8"`` halves the bytes and gives the same images when the pipeline's output is uint8
    (``output_type="pil"``, or frames you quantise as ``round(255 · x)``): a level ``v`` comes back
    as ``v / 127.5 − 1``, which the pipeline's ``(x / 2 + 0.5) · 255`` rounds back to ``v``.
    """

    def __init__(self, url: str, model: str | None = None, *, frames: FrameTransfer = "float16",
                 api_key: str | None = None, timeout: float = 600.0):
        import torch
        from diffusers.configuration_utils import FrozenDict

        if frames not in ("float16", "uint8"):
            raise ValueError(f"frames must be 'float16' or 'uint8', not {frames!r}")
        self.url, self.frames, self.api_key, self.timeout = url.rstrip("/"), frames, api_key, timeout
        self.info = pick_model(served_models(self.url, api_key=api_key), model)
        self.model: str = self.info["id"]  # every request names it (/v1/models/{id}/decode)
        self.config = FrozenDict(self.info["config"])
        latents = self.info["latents"]
        self.spatial_compression_ratio: int = latents["spatial_scale"]
        self.temporal_compression_ratio: int | None = latents["temporal_scale"]
        # LTX's statistics as diffusers keeps them (buffers the pipelines read as ``vae.latents_mean``
        # and ``vae.latents_std``, dividing the std by ``scaling_factor`` themselves); the server lists
        # the std already divided (what ``denormalize`` applies).
        scaling = self.config.get("scaling_factor") or 1.0
        self.latents_mean = torch.tensor(latents["latents_mean"], dtype=torch.float32)
        self.latents_std = torch.tensor(latents["latents_std"], dtype=torch.float32) * scaling
        self._dtype, self._device = torch.float32, torch.device("cpu")

    # ---- what pipelines read of a model ----------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the frames ``decode`` returns (the server decodes in its own dtype)."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        """Where the latents are expected and the frames are put."""
        return self._device

    def to(self, *args: Any, **kwargs: Any) -> RemoteVAE:
        """``torch.nn.Module.to``'s arguments: a device and/or a dtype; returns this object."""
        import torch

        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        self._device = self._device if device is None else torch.device(device)
        self._dtype = self._dtype if dtype is None else dtype
        return self

    def modules(self) -> Iterator[RemoteVAE]:
        """Itself (diffusers looks for offloading hooks on a model's modules; it has none)."""
        yield self

    def __getattr__(self, name: str) -> Any:
        """A config key read as an attribute (``vae.temperal_downsample``), as diffusers' models allow."""
        config = self.__dict__.get("config")
        if config is not None and name in config:
            return config[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # Tiling, slicing and framewise decoding are the server's business (it decodes in bands across
    # its devices and refuses what does not fit): the switches a pipeline or a user flips do nothing.
    def enable_tiling(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def disable_tiling(self) -> None:
        pass

    def enable_slicing(self) -> None:
        pass

    def disable_slicing(self) -> None:
        pass

    # ---- decode and encode -----------------------------------------------------------------------

    def decode(self, z: torch.Tensor, temb: torch.Tensor | float | None = None, *, return_dict: bool = True):
        """Frames ``(B, 3, F, H, W)`` (an image model's ``(B, 3, H, W)``) in [-1, 1] for latents as the
        pipeline hands them to its VAE (already denormalized: nothing is scaled on the server).
        ``temb``: the decode timestep of a timestep-conditioned decoder (LTX), one per row or one
        for all; the pipeline has mixed its noise into ``z`` already, so none is added here."""
        from diffusers.models.autoencoders.vae import DecoderOutput

        timesteps = per_row_timesteps(temb, z.shape[0])
        if timesteps is None or len(set(timesteps)) == 1:
            sample = self._decode_rows(z, None if timesteps is None else timesteps[0])
        else:  # the server takes one timestep a request: rows with different ones go apart
            import torch

            sample = torch.cat([self._decode_rows(z[i:i + 1], t) for i, t in enumerate(timesteps)])
        return DecoderOutput(sample=sample) if return_dict else (sample,)

    def _decode_rows(self, z: torch.Tensor, timestep: float | None) -> torch.Tensor:
        import torch

        conditions = {} if timestep is None else {"timestep": timestep, "noise_scale": 0.0}
        answer = decode_latents(self.url, latents_array(z), output_type="pt", api_key=self.api_key, model=self.model,
                                timeout=self.timeout, partial_postprocess=self.frames == "uint8", **conditions)
        frames = torch.from_numpy(np.array(answer))
        if self.frames == "uint8":  # channels-last levels back to channels-first [-1, 1]
            frames = frames.movedim(-1, 1).to(torch.float32) / 127.5 - 1
        return frames.to(device=z.device, dtype=self._dtype)

    def encode(self, x: torch.Tensor, return_dict: bool = True):
        """``latent_dist`` of frames ``(B, 3, F, H, W)`` (an image model's ``(B, 3, H, W)``) in [-1, 1]:
        ``mode()`` is the posterior mean the server computes."""
        from diffusers.models.modeling_outputs import AutoencoderKLOutput

        latent_dist = RemotePosterior(self, x)
        return AutoencoderKLOutput(latent_dist=latent_dist) if return_dict else (latent_dist,)


class RemotePosterior:
    """The posterior of frames encoded on the server: asked for when a latent is read."""

    def __init__(self, vae: RemoteVAE, frames: torch.Tensor):
        self.vae, self.frames = vae, frames
        self._mean: torch.Tensor | None = None

    def _encode(self, **params: Any) -> torch.Tensor:
        import torch

        vae = self.vae
        latents = encode_frames(vae.url, np.ascontiguousarray(latents_array(self.frames)), api_key=vae.api_key,
                                timeout=vae.timeout, model=vae.model, **params)
        return torch.from_numpy(np.array(latents)).to(device=self.frames.device, dtype=self.frames.dtype)

    @property
    def mean(self) -> torch.Tensor:
        if self._mean is None:
            self._mean = self._encode()
        return self._mean

    def mode(self) -> torch.Tensor:
        return self.mean

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """A draw from the posterior, made on the server with a seed taken from ``generator``: the
        same generator state gives the same latents, but not the noise torch would have drawn."""
        import torch

        seed = int(torch.randint(0, SEED_BOUND, (1,), generator=generator, dtype=torch.int64))
        return self._encode(sample=True, seed=seed)


def pick_model(served: list[dict], model: str | None) -> dict:
    """The entry of ``GET /v1/models`` named ``model`` (None: the only one served)."""
    ids = [entry["id"] for entry in served]
    if model is None and len(served) == 1:
        return served[0]
    for entry in served:
        if entry["id"] == model:
            return entry
    raise ValueError(f"the server serves {ids}; asked for {model!r}")


def per_row_timesteps(temb: Any, batch: int) -> list[float] | None:
    """A decode timestep as one float per row (None: none given)."""
    if temb is None:
        return None
    values = np.asarray(temb.detach().float().cpu() if hasattr(temb, "detach") else temb, np.float32).reshape(-1)
    if values.size not in (1, batch):
        raise ValueError(f"decode timestep has {values.size} values for {batch} rows")
    return [float(v) for v in np.broadcast_to(values, (batch,))]


def latents_array(tensor: torch.Tensor) -> np.ndarray:
    """A tensor as numpy, float16 kept (the server takes it: half the bytes), anything else float32."""
    import torch

    kept = torch.float16 if tensor.dtype == torch.float16 else torch.float32
    return tensor.detach().to(device="cpu", dtype=kept).numpy()
