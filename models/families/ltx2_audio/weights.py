"""Reading LTX-2's audio VAE and vocoder from diffusers folders: a pipeline folder's ``audio_vae/``
and ``vocoder/``, or either folder alone (``config.json`` + ``diffusion_pytorch_model.safetensors``).

Our parameters keep diffusers' names and PyTorch's layouts (``models.families.ltx2_audio.modules``),
so a tensor goes to the parameter whose path, joined by dots, is its name. Every problem (missing,
unexpected, mis-shaped) is reported at once, as ``models.loading.WeightsError``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import jax.numpy as jnp
import numpy as np
from flax import nnx

from vaeserve.models.loading import WEIGHTS_NAME, WeightsError
from vaeserve.models.vae import resolve_dtype

from .config import LTX2AudioVAEConfig, LTX2VocoderConfig, LTX2VocoderWithBWEConfig
from .modules import AudioDecoder, AudioEncoder
from .vocoder import Vocoder, VocoderWithBWE

AUDIO_VAE_FOLDER, VOCODER_FOLDER = "audio_vae", "vocoder"
DECODER_PREFIX, ENCODER_PREFIX = "decoder.", "encoder."
# Tensors of the audio VAE that are no weights of a module: the latents' statistics, which the
# pipeline's normalisation reads (``AudioStatistics``).
STATISTICS = ("latents_mean", "latents_std")
Built = TypeVar("Built", bound=nnx.Module)


class AudioStatistics(NamedTuple):
    """The audio VAE's ``latents_mean`` / ``latents_std`` buffers, float32, over the packed ``C·M``
    features of a latent frame."""

    mean: np.ndarray
    std: np.ndarray


def read_folder(folder: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A diffusers folder's ``config.json`` body and its safetensors tensors (host arrays)."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    raw = json.loads((folder / "config.json").read_text())
    return raw, load_file(str(folder / WEIGHTS_NAME))


def component_folder(path: str | Path, component: str) -> Path:
    """``path/component`` for a pipeline folder (or any folder holding it), else ``path`` itself."""
    path = Path(path)
    return path / component if (path / component / "config.json").is_file() else path


def module_names(module: nnx.Module) -> dict[str, tuple[tuple, Any]]:
    """``{diffusers name: (path, variable)}`` of a module's parameters (the path joined by dots)."""
    _, state = nnx.split(module)
    return {".".join(str(p) for p in path): (path, var) for path, var in nnx.to_flat_state(state)}


def load_module(build: Callable[[], Built], tensors: dict[str, Any], *, prefix: str = "",
                source: str = "checkpoint") -> Built:
    """``build()`` (shapes only) with its parameters read from ``tensors[prefix + name]``, each
    cast to the parameter's dtype. The tensors under ``prefix`` must be exactly the parameters."""
    graphdef, state = nnx.split(nnx.eval_shape(build))
    expected = {prefix + ".".join(str(p) for p in path): (path, var) for path, var in nnx.to_flat_state(state)}
    given = {name for name in tensors if name.startswith(prefix)}
    misshaped = [f"{name}: expected {tuple(var.shape)}, received {tuple(np.shape(tensors[name]))}"
                 for name, (_, var) in expected.items() if name in given and tuple(np.shape(tensors[name])) != var.shape]
    missing, unexpected = sorted(set(expected) - given), sorted(given - set(expected))
    if missing or unexpected or misshaped:
        raise WeightsError(missing, unexpected, misshaped, source)
    leaves = [(path, var.replace(jnp.asarray(np.asarray(tensors[name]), var.dtype))) for name, (path, var) in expected.items()]
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def audio_statistics(tensors: dict[str, Any]) -> AudioStatistics:
    return AudioStatistics(*(np.asarray(tensors[name], np.float32).reshape(-1) for name in STATISTICS))


def load_audio_decoder(path: str | Path, *, dtype: str = "float32") -> tuple[AudioDecoder, AudioStatistics]:
    """The decoder and the latents' statistics of an ``AutoencoderKLLTX2Audio`` folder (or of the
    ``audio_vae/`` of a pipeline folder). The encoder's tensors are passed over (``load_audio_encoder``)."""
    folder = component_folder(path, AUDIO_VAE_FOLDER)
    raw, tensors = read_folder(folder)
    config = LTX2AudioVAEConfig.from_dict(raw)
    target = resolve_dtype(dtype)
    decoder = load_module(lambda: AudioDecoder(config, dtype=target), tensors, prefix=DECODER_PREFIX,
                          source=str(folder))
    return decoder, audio_statistics(tensors)


def load_audio_encoder(path: str | Path, *, dtype: str = "float32") -> AudioEncoder:
    """The encoder of an ``AutoencoderKLLTX2Audio`` folder (or of a pipeline folder's ``audio_vae/``)."""
    folder = component_folder(path, AUDIO_VAE_FOLDER)
    raw, tensors = read_folder(folder)
    config = LTX2AudioVAEConfig.from_dict(raw)
    return load_module(lambda: AudioEncoder(config, dtype=resolve_dtype(dtype)), tensors, prefix=ENCODER_PREFIX,
                       source=str(folder))


def load_vocoder(path: str | Path, *, dtype: str = "float32") -> Vocoder | VocoderWithBWE:
    """The ``LTX2Vocoder`` or ``LTX2VocoderWithBWE`` (by the config's ``_class_name``) of a folder
    (or of the ``vocoder/`` of a pipeline folder)."""
    folder = component_folder(path, VOCODER_FOLDER)
    raw, tensors = read_folder(folder)
    target = resolve_dtype(dtype)
    if raw.get("_class_name") == LTX2VocoderWithBWEConfig.class_name:
        bwe = LTX2VocoderWithBWEConfig.from_dict(raw)
        return load_module(lambda: VocoderWithBWE(bwe, dtype=target), tensors, source=str(folder))
    config = LTX2VocoderConfig.from_dict(raw)
    return load_module(lambda: Vocoder(config, dtype=target), tensors, source=str(folder))
