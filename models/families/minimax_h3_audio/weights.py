"""Reading MiniMax-H3's audio VAE from a diffusers folder: a pipeline folder's ``audio_vae/``, or
the folder alone (``config.json`` + ``diffusion_pytorch_model.safetensors``); and the same
architecture with seeded random weights, for tests and demos.

Our parameters keep diffusers' names and PyTorch's layouts (``models.families.minimax_h3_audio.modules``),
so a tensor goes to the parameter whose path, joined by dots, is its name. The decoder takes the
tensors under ``dec_in_proj.`` and ``decoder.``, the encoder those under ``encoder.``, ``pre_block.``
and ``mean_proj.``; ``logs_proj.`` (the posterior's spread, which MiniMax-H3 never samples) is
passed over. Every problem (missing, unexpected, mis-shaped) is reported at once, as
``models.loading.WeightsError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from vaeserve.models.families.ltx2_audio.weights import component_folder, load_module, read_folder
from vaeserve.models.vae import resolve_dtype

from .config import ANTIALIAS_KERNEL, ANTIALIAS_RATIO, MiniMaxH3AudioConfig
from .modules import H3AudioDecoder, H3AudioEncoder, kaiser_sinc_taps

AUDIO_VAE_FOLDER = "audio_vae"
DECODER_PREFIXES = ("dec_in_proj.", "decoder.")
ENCODER_PREFIXES = ("encoder.", "pre_block.", "mean_proj.")


def tensors_under(tensors: dict[str, Any], prefixes: tuple[str, ...]) -> dict[str, Any]:
    return {name: t for name, t in tensors.items() if name.startswith(prefixes)}


def read_audio_vae(path: str | Path) -> tuple[MiniMaxH3AudioConfig, dict[str, np.ndarray], Path]:
    """The config and tensors of an ``AutoencoderKLMiniMaxH3Audio`` folder (or of a pipeline
    folder's ``audio_vae/``), and the folder read."""
    folder = component_folder(path, AUDIO_VAE_FOLDER)
    raw, tensors = read_folder(folder)
    return MiniMaxH3AudioConfig.from_dict(raw), tensors, folder


def load_h3_audio_decoder(path: str | Path, *, dtype: str = "float32") -> H3AudioDecoder:
    """The decoder of an ``AutoencoderKLMiniMaxH3Audio`` folder (or of a pipeline folder's ``audio_vae/``)."""
    config, tensors, folder = read_audio_vae(path)
    target = resolve_dtype(dtype)
    return load_module(lambda: H3AudioDecoder(config, dtype=target), tensors_under(tensors, DECODER_PREFIXES),
                       source=str(folder))


def load_h3_audio_encoder(path: str | Path, *, dtype: str = "float32") -> H3AudioEncoder:
    """The encoder (to the posterior's mean) of an ``AutoencoderKLMiniMaxH3Audio`` folder (or of a
    pipeline folder's ``audio_vae/``)."""
    config, tensors, folder = read_audio_vae(path)
    target = resolve_dtype(dtype)
    return load_module(lambda: H3AudioEncoder(config, dtype=target), tensors_under(tensors, ENCODER_PREFIXES),
                       source=str(folder))


# -- seeded random weights -------------------------------------------------------------------------
def seeded_value(path: tuple, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A parameter's random value, by its name: the sinc filters and the key's zero bias as in
    every checkpoint, Snake and LayerNorm scales at diffusers' initial values (DAC's linear ``alpha``
    1, SnakeBeta's log-scale ``alpha`` and ``beta`` 0), weight-norm directions N(0, 1) with norms 1,
    other kernels N(0, 1/fan-in), biases N(0, 0.02²)."""
    name, parent = str(path[-1]), str(path[-2]) if len(path) > 1 else ""
    if name == "filter":
        return kaiser_sinc_taps(0.5 / ANTIALIAS_RATIO, 0.6 / ANTIALIAS_RATIO, ANTIALIAS_KERNEL)
    if name == "zero_k_bias" or (parent == "act" and name in ("alpha", "beta")):
        return np.zeros(shape, np.float32)
    if name in ("alpha", "weight_g") or (parent.startswith("norm") and name == "weight"):
        return np.ones(shape, np.float32)
    if name.endswith("bias"):
        return 0.02 * rng.standard_normal(shape, np.float32)
    if name == "weight_v":
        return rng.standard_normal(shape, np.float32)
    return rng.standard_normal(shape, np.float32) / np.float32(np.sqrt(np.prod(shape[1:])))


def seeded_h3_module(build, seed: int):
    """``build()`` (shapes only) with ``seeded_value``s drawn on the host, in path order."""
    graphdef, state = nnx.split(nnx.eval_shape(build))
    rng = np.random.default_rng(seed)
    leaves = [(path, var.replace(jnp.asarray(seeded_value(path, var.shape, rng), var.dtype)))
              for path, var in nnx.to_flat_state(state)]
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def seeded_h3_audio(config: MiniMaxH3AudioConfig | None = None, *, seed: int = 0,
                    dtype: str = "float32") -> tuple[H3AudioDecoder, H3AudioEncoder]:
    """The decoder and encoder of ``config`` (the release's by default) with seeded random weights:
    the real architecture, decoding noise."""
    config, target = config or MiniMaxH3AudioConfig(), resolve_dtype(dtype)
    return (seeded_h3_module(lambda: H3AudioDecoder(config, dtype=target), seed),
            seeded_h3_module(lambda: H3AudioEncoder(config, dtype=target), seed + 1))
