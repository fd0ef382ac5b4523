"""Load a VAE — Wan 2.1 / 2.2, HunyuanVideo 1.0 / 1.5, LTX-Video, LTX-2, and the image VAEs (AutoencoderKL:
SD, SDXL, Flux.1; Flux.2; Qwen-Image) — from diffusers folders, safetensors files or the original releases'
checkpoints.

The family comes from the config's ``_class_name`` (``models.config.config_from_dict``), or, for a
checkpoint file without a diffusers config beside it, from its tensor names. The decoder's
tensors must all be there. The encoder's (``encoder.*``, ``quant_conv.*``) are loaded when the
checkpoint has any of them (and must then all be there); a decode-only checkpoint loads for
decoding, and ``encode`` then says that it has no encoder.

Accepted ``path``s:
  * a diffusers folder: ``config.json`` + ``diffusion_pytorch_model.safetensors`` (or the sharded
    ``diffusion_pytorch_model.safetensors.index.json`` form);
  * a pipeline folder (``model_index.json`` + ``vae/``), or any folder with a ``vae/`` subfolder; the
    pipeline's decode defaults come along (``pipeline_defaults``: an LTX pipeline's
    ``decode_timestep`` and ``decode_noise_scale``, in ``vae.metadata``);
  * a checkpoint file: ``.safetensors`` or a PyTorch file (``.pth``/``.pt``/``.ckpt``: needs torch,
    read with ``weights_only=True``) in diffusers' naming or an original release's: Wan's
    ``Wan2.1_VAE.pth`` / ``Wan2.2_VAE.pth``, HunyuanVideo's ``vae/pytorch_model.pt`` (diffusers'
    names, maybe under ``vae.``), HunyuanVideo 1.5's ``vae/diffusion_pytorch_model.safetensors``
    (``decoder.up.{i}.block.{j}`` names), Lightricks' LTX-Video and LTX-2 single files (``vae.*``
    among the transformer's tensors), and latent diffusion's names (``models.keys.ldm_to_diffusers``)
    of SD/SDXL single-file checkpoints (the VAE under ``first_stage_model.``, the rest passed over),
    their stand-alone VAE files and Flux's ``ae.safetensors``. A diffusers ``config.json`` beside it
    is used when present, else the real config of the family (and release) its names belong to;
  * an embedded model name (``MODEL_NAMES``): ``"wan2.1"`` (also ``None``), ``"wan2.2"``,
    ``"hunyuan1.0"``, ``"hunyuan1.5"``, ``"ltx-video"`` (0.9.5 – 0.9.8), ``"ltx2"`` (LTX-2), ``"sd"``,
    ``"sdxl"``, ``"flux1"``, ``"flux2"``, ``"qwen-image"``: the real architecture with deterministic
    seeded random weights. It decodes noise and says so (logs, ``vae.metadata["random_weights"]``). A
    folder with such a name loads as ``"./wan2.2"``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import keys
from .config import (
    CONFIG_CLASSES,
    AutoencoderKLConfig,
    AutoencoderKLFlux2Config,
    ConfigError,
    HunyuanVideo15Config,
    HunyuanVideoConfig,
    LTX2VideoConfig,
    LTXVideoConfig,
    QwenImageConfig,
    VAEConfig,
    WanVAEConfig,
    config_from_dict,
    read_config,
)
from .families import family_of
from .ltx_config import STATISTICS_TENSORS
from .vae import VAE, abstract_module, init_vae, resolve_dtype

log = logging.getLogger("vaeserve.models")

DEFAULT_SEED = 0
# Architectures by name: their configs need no checkpoint (planning compiles from shapes alone), and
# ``load_vae(name)`` builds them with seeded random weights (the embedded models).
MODEL_NAMES: dict[str, Callable[[], VAEConfig]] = {
    "wan2.1": WanVAEConfig, "wan2.2": WanVAEConfig.wan22, "hunyuan1.0": HunyuanVideoConfig,
    "hunyuan1.5": HunyuanVideo15Config, "ltx-video": LTXVideoConfig.v095, "ltx2": LTX2VideoConfig.ltx2,
    "sd": AutoencoderKLConfig.sd, "sdxl": AutoencoderKLConfig.sdxl, "flux1": AutoencoderKLConfig.flux1,
    "flux2": AutoencoderKLFlux2Config, "qwen-image": QwenImageConfig}
# What each embedded name is, in words (logs and metadata).
MODEL_TITLES = {"wan2.1": "Wan 2.1", "wan2.2": "Wan 2.2", "hunyuan1.0": "HunyuanVideo",
                "hunyuan1.5": "HunyuanVideo 1.5", "ltx-video": "LTX-Video 0.9.5", "ltx2": "LTX-2",
                "sd": "Stable Diffusion 1.x/2.x", "sdxl": "SDXL", "flux1": "Flux.1", "flux2": "Flux.2",
                "qwen-image": "Qwen-Image"}
# A pipeline's decode defaults, read from its ``model_index.json`` when it states them (the names of
# the LTX pipelines' call arguments), kept in ``vae.metadata`` and used by ``VAE.decode``.
PIPELINE_DEFAULTS = ("decode_timestep", "decode_noise_scale")
DEFAULT_MODEL = "wan2.1"
WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
INDEX_NAME = WEIGHTS_NAME + ".index.json"
# The encoder's tensors: optional as a whole (a decode-only checkpoint has none of them).
ENCODER_PREFIXES = ("encoder.", "quant_conv.")
# Tensors a checkpoint may hold that are no weights of the model: passed over. (Flux.2's BatchNorm
# counts its training batches; diffusers initialises the count to 0 where a checkpoint lacks it.)
IGNORED_TENSORS = frozenset({"bn.num_batches_tracked"})
# Where a whole latent-diffusion checkpoint (SD, SDXL) holds its VAE, in latent diffusion's names.
LDM_PREFIXES = ("first_stage_model.", "vae.")


class WeightsError(ValueError):
    """Checkpoint tensors that do not fit the config: every problem listed at once."""

    def __init__(self, missing: list[str], unexpected: list[str], misshaped: list[str], source: str):
        self.missing, self.unexpected, self.misshaped = missing, unexpected, misshaped
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing: {missing}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected: {unexpected}")
        if misshaped:
            parts.append(f"{len(misshaped)} mis-shaped: {misshaped}")
        super().__init__(f"weights in {source} do not fit the config; " + "; ".join(parts))


# -- reading tensors ------------------------------------------------------------------------------
def _read_safetensors(files: list[Path]) -> dict[str, Any]:
    from safetensors import safe_open

    tensors: dict[str, Any] = {}
    for file in files:
        # Host arrays: the model is assembled on the host and placed once (bfloat16 via ml_dtypes).
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def _read_pth(path: Path) -> dict[str, Any]:
    return {name: _torch_to_numpy(t) for name, t in _torch_state(path).items()}


def _torch_state(path: Path) -> dict[str, Any]:
    """A ``.pth`` state dict, memory-mapped (tensors are read when touched), unwrapped."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"reading {path.name} needs PyTorch (pip install 'vaeserve[torch]'), or convert it once "
            "with `vaeserve convert IN OUT_DIR` on a machine that has it"
        ) from e
    state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    for wrapper in ("state_dict", "model", "module"):
        if isinstance(state, dict) and wrapper in state and isinstance(state[wrapper], dict):
            state = state[wrapper]
    return state


def _torch_to_numpy(tensor) -> np.ndarray:
    import ml_dtypes
    import torch

    if tensor.dtype == torch.bfloat16:  # NumPy has no bfloat16: reinterpret the same bits
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _is_original_naming(names) -> bool:
    """Original Wan release names (``decoder.middle.*``, ``decoder.upsamples.*``, ``conv2.*``)."""
    return any(n.startswith(("decoder.middle.", "decoder.upsamples.", "conv2.")) for n in names)


def _is_original_hunyuan15_naming(names) -> bool:
    """Original HunyuanVideo 1.5 names (``decoder.mid.block_1.*``, ``decoder.up.0.block.0.*``, RMS
    ``gamma``s: latent diffusion's names of an AutoencoderKL are alike, with GroupNorm ``weight``s)."""
    return (any(n.startswith(("decoder.mid.", "decoder.up.", "encoder.down.", "encoder.mid.")) for n in names)
            and _ldm_prefix(names) is None)


def _ldm_prefix(names) -> str | None:
    """The prefix under which a checkpoint holds an AutoencoderKL in latent diffusion's names (``""``
    for a VAE file, ``"first_stage_model."`` in a whole SD/SDXL checkpoint), or None."""
    names = set(names)
    return next((p for p in ("", *LDM_PREFIXES) if f"{p}decoder.mid.block_1.norm1.weight" in names), None)


def kl_config_for_names(names, prefix: str = "") -> AutoencoderKLConfig | AutoencoderKLFlux2Config:
    """The real config of an AutoencoderKL checkpoint (its tensors under ``prefix``, in latent
    diffusion's names or diffusers'): Flux.2 (BatchNorm statistics ``bn.*``), Flux.1 (no
    ``post_quant_conv``), SDXL (a whole checkpoint with SDXL's ``conditioner.*`` text encoders) or
    SD. A stand-alone SDXL VAE file reads as SD: the two differ only in ``scaling_factor`` (what
    ``denormalize`` uses); a config.json beside it says which."""
    names = list(names)
    if f"{prefix}bn.running_mean" in names:
        return AutoencoderKLFlux2Config()
    if f"{prefix}post_quant_conv.weight" not in names:
        return AutoencoderKLConfig.flux1()
    if any(n.startswith("conditioner.") for n in names):
        return AutoencoderKLConfig.sdxl()
    return AutoencoderKLConfig.sd()


def from_ldm_names(tensors: dict[str, Any], config: AutoencoderKLConfig | AutoencoderKLFlux2Config) -> dict[str, Any]:
    """An AutoencoderKL's tensors in latent diffusion's names (under their prefix; the rest of a
    whole checkpoint passed over) in diffusers' names and layouts: the attention's 1x1 conv
    weights ``(O, I, 1, 1)`` become the linear layers' ``(O, I)``."""
    prefix = _ldm_prefix(tensors) or ""
    renamed = {keys.ldm_to_diffusers(n.removeprefix(prefix), len(config.block_out_channels)): t
               for n, t in tensors.items() if n.startswith(prefix)}
    attention = re.compile(r"(encoder|decoder)\.mid_block\.attentions\.0\.to_(q|k|v|out\.0)\.weight")
    return {n: t[:, :, 0, 0] if attention.fullmatch(n) and np.ndim(t) == 4 else t for n, t in renamed.items()}


def original_release_config(names) -> WanVAEConfig:
    """The real config of the original Wan release whose key names these are: Wan 2.2's blocks nest
    their layers (``decoder.upsamples.0.upsamples.0.*``), Wan 2.1's are flat."""
    nested = re.compile(r"decoder\.upsamples\.\d+\.upsamples\.")
    return WanVAEConfig.wan22() if any(nested.match(n) for n in names) else WanVAEConfig()


def _is_original_ltx_naming(names) -> bool:
    """Lightricks' LTX-Video / LTX-2 names (``vae.decoder.up_blocks.0.res_blocks.0.*``)."""
    return any(n.startswith("vae.") and ".res_blocks." in n for n in names)


def ltx_release_config(names) -> VAEConfig:
    """The real config of the LTX release whose (original) tensor names these are: LTX-Video 0.9.0
    (ten decoder blocks), 0.9.1 (a timestep embedding, strided-conv encoder), 0.9.5 – 0.9.8 (a
    timestep embedding, space-to-depth encoder), LTX-2.3 / 2.5 (nine decoder blocks) or LTX-2."""
    names = {n.removeprefix("vae.") for n in names}
    if "decoder.up_blocks.9.res_blocks.0.conv1.conv.weight" in names:
        return LTXVideoConfig()
    if "decoder.last_time_embedder.timestep_embedder.linear_1.weight" in names:
        return LTXVideoConfig.v095() if "encoder.down_blocks.1.conv.conv.weight" in names else LTXVideoConfig.v091()
    if any(n.startswith("decoder.up_blocks.8.") for n in names):
        return LTX2VideoConfig.ltx23()
    return LTX2VideoConfig.ltx2()


def _ltx_diffusers_release(names: set[str]) -> VAEConfig:
    """``ltx_release_config`` for diffusers' names: four up blocks are LTX-Video 0.9.0 (strided-conv
    encoder) or LTX-2.3; a decoder time embedding LTX-Video 0.9.1 (strided-conv encoder) or 0.9.5."""
    strided = "encoder.down_blocks.0.downsamplers.0.conv.weight" in names
    if "decoder.time_embedder.timestep_embedder.linear_1.weight" in names:
        return LTXVideoConfig.v091() if strided else LTXVideoConfig.v095()
    if any(n.startswith("decoder.up_blocks.3.") for n in names):
        return LTXVideoConfig() if strided else LTX2VideoConfig.ltx23()
    return LTX2VideoConfig.ltx2()


def _without_vae_prefix(names) -> bool:
    """HunyuanVideo's original checkpoint may hold its VAE under ``vae.`` (its loader keeps those)."""
    return any(n.startswith("vae.") for n in names)


def config_for_names(names) -> VAEConfig:
    """The real config of the family (and release) whose tensor names these are, for a checkpoint
    without a diffusers ``config.json``: an original release's names (latent diffusion's for the
    AutoencoderKL family), else diffusers' names of AutoencoderKL (GroupNorm ``conv_norm_out`` and a
    plain ``conv_in``), HunyuanVideo (GroupNorm ``conv_norm_out``, wrapped ``conv_in.conv``),
    HunyuanVideo 1.5 (``norm_out.gamma`` and wrapped ``conv_in.conv``), LTX (the ``latents_mean``
    tensor beside a wrapped ``conv_in.conv``) or, by default, Wan (whose names Qwen-Image's share: a
    Qwen-Image file needs its config.json beside it)."""
    names = list(names)
    if (prefix := _ldm_prefix(names)) is not None:
        return kl_config_for_names(names, prefix)
    if _is_original_naming(names):
        return original_release_config(names)
    if _is_original_hunyuan15_naming(names):
        return HunyuanVideo15Config()
    if _is_original_ltx_naming(names):
        return ltx_release_config(names)
    if {"decoder.conv_norm_out.weight", "decoder.conv_in.weight"} <= set(names):
        return kl_config_for_names(names)
    names = [n.removeprefix("vae.") for n in names]
    if "latents_mean" in names and "decoder.conv_in.conv.weight" in names:  # diffusers' LTX buffers
        return _ltx_diffusers_release(set(names))
    if "decoder.conv_norm_out.weight" in names:
        return HunyuanVideoConfig()
    if "decoder.conv_in.conv.weight" in names:
        return HunyuanVideo15Config()
    return WanVAEConfig()


def to_diffusers_names(tensors: dict[str, Any], config: VAEConfig) -> dict[str, Any]:
    """Checkpoint tensors under diffusers' names: original Wan (also as Qwen-Image), HunyuanVideo 1.5
    and latent diffusion's names renamed, HunyuanVideo's ``vae.`` prefix dropped (with whatever else
    its checkpoint holds); diffusers' names unchanged."""
    if _ldm_prefix(tensors) is not None and isinstance(config, AutoencoderKLConfig | AutoencoderKLFlux2Config):
        return from_ldm_names(tensors, config)
    if _is_original_naming(tensors) and isinstance(config, WanVAEConfig | QwenImageConfig):
        return {keys.original_to_diffusers(n, config.num_res_blocks): t for n, t in tensors.items()}
    if _is_original_hunyuan15_naming(tensors):
        return {keys.hunyuan15_original_to_diffusers(n): t for n, t in tensors.items()}
    if _is_original_ltx_naming(tensors) and isinstance(config, LTXVideoConfig | LTX2VideoConfig):
        return ltx_to_diffusers_names(tensors, config)
    if _without_vae_prefix(tensors):
        return {n.removeprefix("vae."): t for n, t in tensors.items() if n.startswith("vae.")}
    return tensors


def ltx_to_diffusers_names(tensors: dict[str, Any], config: LTXVideoConfig | LTX2VideoConfig) -> dict[str, Any]:
    """A Lightricks checkpoint's ``vae.*`` tensors under diffusers' names (``keys.ltx_original_to_diffusers``);
    the transformer's, the audio VAE's and the statistics diffusers does not keep are left out."""
    prefixes = keys.ltx_block_prefixes(config.decoder_plan(), config.encoder_plan())
    wrapped = config.decoder_plan().conv_shortcut_wrapped
    renamed = {}
    for name, tensor in tensors.items():
        if name.startswith(keys.LTX_PREFIX):
            new = keys.ltx_original_to_diffusers(name[len(keys.LTX_PREFIX):], prefixes, wrapped_shortcut=wrapped)
            if new is not None:
                renamed[new] = tensor
    return renamed


def pipeline_defaults(path: Path) -> dict[str, float]:
    """The decode defaults a pipeline folder's ``model_index.json`` states (``PIPELINE_DEFAULTS``);
    empty for a VAE folder or a pipeline that states none."""
    index = path / "model_index.json"
    if not index.is_file():
        return {}
    raw = json.loads(index.read_text(encoding="utf-8"))
    defaults = {}
    for name in PIPELINE_DEFAULTS:
        value = raw.get(name)
        if isinstance(value, list) and value:  # a pipeline may state one per row; all rows take the first
            value = value[0]
        if isinstance(value, int | float) and not isinstance(value, bool):
            defaults[name] = float(value)
        elif value is not None:
            raise ConfigError(f"{index}: {name}={value!r}; expected a number")
    return defaults


def _diffusers_folder(path: Path) -> Path:
    if (path / "config.json").is_file() and not (path / "model_index.json").is_file():
        return path
    if (path / "vae" / "config.json").is_file():
        return path / "vae"
    raise FileNotFoundError(f"{path} holds neither a diffusers VAE (config.json) nor a vae/ subfolder")


def _folder_weights(folder: Path) -> list[Path]:
    if (folder / WEIGHTS_NAME).is_file():
        return [folder / WEIGHTS_NAME]
    if (folder / INDEX_NAME).is_file():
        weight_map = json.loads((folder / INDEX_NAME).read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    raise FileNotFoundError(f"{folder} has no {WEIGHTS_NAME} nor {INDEX_NAME}")


# -- building the model ---------------------------------------------------------------------------
def _parameters(module_type, config: VAEConfig, dtype) -> tuple[Any, dict[str, tuple]]:
    """``(graphdef, {diffusers name: (path, abstract variable)})`` of a module, without computing weights."""
    graphdef, state = nnx.split(abstract_module(module_type, config, dtype))
    return graphdef, {keys.diffusers_key(path): (path, var) for path, var in nnx.to_flat_state(state)}


def _misshaped(expected: dict[str, tuple], tensors: dict[str, Any]) -> list[str]:
    problems = []
    for name, (_, var) in expected.items():
        if name in tensors:
            want = keys.torch_shape(var)
            got = tuple(np.shape(tensors[name]))
            if got != want:
                problems.append(f"{name}: expected {want}, received {got}")
    return problems


def _assemble(graphdef, expected: dict[str, tuple], tensors: dict[str, Any], target) -> Any:
    leaves = []
    for name, (path, var) in expected.items():
        array = keys.from_torch(var, np.asarray(tensors[name]))
        leaves.append((path, var.replace(jnp.asarray(array, target))))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def _with_statistics(config: VAEConfig, tensors: dict[str, Any]) -> tuple[VAEConfig, dict[str, Any]]:
    """An LTX checkpoint's ``latents_mean`` / ``latents_std`` tensors (diffusers' buffers) moved into
    its config; the other tensors. Other families keep their statistics in the config itself."""
    if not hasattr(config, "with_statistics"):
        return config, tensors
    rest = {n: t for n, t in tensors.items() if n not in STATISTICS_TENSORS}
    if all(n in tensors for n in STATISTICS_TENSORS):
        config = config.with_statistics(*(np.asarray(tensors[n], np.float32).reshape(-1) for n in STATISTICS_TENSORS))
    return config, rest


def build_vae(config: VAEConfig, tensors: dict[str, Any], *, dtype: str, metadata: dict[str, Any]) -> VAE:
    """Assemble a ``VAE`` of the config's family from diffusers-named tensors; every key problem is
    reported at once.

    The encoder is built when any ``encoder.*``/``quant_conv.*`` tensor is present, else left out
    (also, with a warning, when this implementation cannot run the config's encoder).
    """
    target = resolve_dtype(dtype)
    family = family_of(config)
    tensors = {n: t for n, t in tensors.items() if n not in IGNORED_TENSORS}
    config, tensors = _with_statistics(config, tensors)
    graphdef, expected = _parameters(family.decoder, config, target)
    with_encoder = any(n.startswith(ENCODER_PREFIXES) for n in tensors)
    if with_encoder:
        try:
            family.check_encoder(config)
        except ConfigError as e:
            log.warning("encoder weights skipped: %s", e)
            metadata = {**metadata, "no_encoder_reason": str(e)}
            tensors = {n: t for n, t in tensors.items() if not n.startswith(ENCODER_PREFIXES)}
            with_encoder = False
    encoder_graphdef, encoder_expected = _parameters(family.encoder, config, target) if with_encoder else (None, {})
    known = set(expected) | set(encoder_expected)
    missing = sorted(known - set(tensors))
    unexpected = sorted(set(tensors) - known)
    misshaped = _misshaped(expected, tensors) + _misshaped(encoder_expected, tensors)
    if missing or unexpected or misshaped:
        raise WeightsError(missing, unexpected, misshaped, metadata.get("source", "checkpoint"))
    model = _assemble(graphdef, expected, tensors, target)
    encoder = _assemble(encoder_graphdef, encoder_expected, tensors, target) if with_encoder else None
    if not with_encoder:
        log.info("%s has no encoder weights: it loads for decoding only", metadata.get("source", "the checkpoint"))
    return VAE(config, model, dtype=dtype, metadata=metadata, encoder=encoder)


def _model_name(path: str | Path | None) -> str | None:
    """The model name ``path`` stands for (None: ``DEFAULT_MODEL``), or None for a real path.
    Only strings are names: ``Path("wan2.2")`` or ``"./wan2.2"`` is a folder."""
    if path is None:
        return DEFAULT_MODEL
    return path if isinstance(path, str) and path in MODEL_NAMES else None


def embedded_vae(name: str = DEFAULT_MODEL, dtype: str = "float32", *,
                 weights_cache: str | Path | None = None) -> VAE:
    """The model ``name`` (``MODEL_NAMES``): the real architecture with seeded random weights.

    ``weights_cache``: a folder where the drawn weights are kept (``<name>-random-weights-seed<seed>/``,
    see ``kept_random_vae``), so that a later start reads them instead of drawing them again
    (the real Wan 2.1's take about 10 s to draw on 2 cores).
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"no embedded model {name!r}; expected one of {sorted(MODEL_NAMES)}")
    log.warning("using the embedded %s VAE with RANDOM weights (seed %d): it decodes noise, not %s",
                name, DEFAULT_SEED, "images" if MODEL_NAMES[name]().is_image else "video")
    config = MODEL_NAMES[name]()
    metadata = {"name": name,
                "source": f"embedded default ({MODEL_TITLES[name]} architecture, random weights, seed {DEFAULT_SEED})"}
    if weights_cache is None:
        return init_vae(config, seed=DEFAULT_SEED, dtype=dtype, metadata=metadata)
    folder = Path(weights_cache) / f"{name}-random-weights-seed{DEFAULT_SEED}"
    return kept_random_vae(config, folder, seed=DEFAULT_SEED, dtype=dtype, metadata=metadata)


def kept_random_vae(config: VAEConfig, folder: Path, *, seed: int, dtype: str = "float32",
                    metadata: dict[str, Any] | None = None) -> VAE:
    """``init_vae(config, seed=seed)``, its weights kept in ``folder`` (a diffusers folder, float32).

    Read back when ``folder`` holds ``config``'s weights; else drawn and written there. The folder
    appears complete or not at all (written beside it, then renamed), so processes sharing it never
    read half a file. One that cannot be read or holds another config is drawn again; one that
    cannot be written costs only the next start the drawing.
    """
    metadata = {**(metadata or {}), "random_weights": True}
    if folder.is_dir():
        try:
            if read_config(folder / "config.json") == config:
                tensors = _read_safetensors([folder / WEIGHTS_NAME])
                log.info("random weights read from %s", folder)
                return build_vae(config, tensors, dtype=dtype, metadata=metadata)
            log.warning("%s holds weights of another config: drawing them again", folder)
        except Exception as error:  # whatever is wrong with a cache, drawing again repairs it
            log.warning("random weights in %s unreadable (%s): drawing them again", folder, error)
    drawn = init_vae(config, seed=seed, dtype="float32", metadata=metadata)
    staging = folder.with_name(f".{folder.name}.{os.getpid()}.partial")
    try:
        save_vae(drawn, staging)
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)  # fails if another process has just kept them: theirs are the same
        log.info("random weights kept in %s", folder)
    except OSError as error:
        log.warning("cannot keep random weights in %s (%s)", folder, error)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if dtype == "float32":
        return drawn
    return build_vae(config, dict(iter_diffusers_tensors(drawn)), dtype=dtype, metadata=metadata)


def _checkpoint_config(config_file: Path, read_names: Callable[[], Iterable[str]]) -> VAEConfig:
    """The config of a checkpoint: the diffusers ``config.json`` beside it (or of its folder) when
    there is one of a known family, else the config its tensor names belong to. An original
    release's own config.json (HunyuanVideo 1.5's is not diffusers') is then passed over. The
    names are read only when the config alone does not decide."""
    if config_file.is_file():
        raw = json.loads(config_file.read_text(encoding="utf-8"))
        if raw.get("_class_name", WanVAEConfig.class_name) in CONFIG_CLASSES:
            return config_from_dict(raw)
        names = list(read_names())
        if not (_is_original_naming(names) or _is_original_hunyuan15_naming(names) or _is_original_ltx_naming(names)
                or _ldm_prefix(names) is not None):
            return config_from_dict(raw)  # its own error names the class it expected
        log.warning("%s is no diffusers VAE config (_class_name %r): using the release its tensor names belong to",
                    config_file, raw.get("_class_name"))
        return config_for_names(names)
    return config_for_names(list(read_names()))


def load_vae(path: str | Path | None = None, dtype: str = "float32", *,
             embedded_weights_cache: str | Path | None = None) -> VAE:
    """Load a VAE of any family (see the module docstring for the accepted ``path``s);
    ``embedded_weights_cache``: where an embedded model keeps its drawn weights (``embedded_vae``)."""
    resolve_dtype(dtype)
    name = _model_name(path)
    if name is not None:
        return embedded_vae(name, dtype, weights_cache=embedded_weights_cache)
    path = Path(path)  # type: ignore[arg-type]
    metadata: dict[str, Any] = {"source": str(path), "random_weights": False}
    if path.is_dir():
        folder = _diffusers_folder(path)
        tensors = _read_safetensors(_folder_weights(folder))
        config_file = folder / "config.json"
        metadata.update(pipeline_defaults(path))
    elif path.is_file():
        tensors = _read_pth(path) if path.suffix in PYTORCH_SUFFIXES else _read_safetensors([path])
        config_file = path.parent / "config.json"
    else:
        raise FileNotFoundError(f"no model at {path}")
    config = _checkpoint_config(config_file, lambda: tensors)
    log.info("loading %s VAE from %s (%s)", config.family, path, dtype)
    return build_vae(config, to_diffusers_names(tensors, config), dtype=dtype, metadata=metadata)


def load_config(path: str | Path | None = None) -> VAEConfig:
    """The config ``load_vae(path)`` would build, read without loading any tensor.

    ``path`` is anything ``load_vae`` accepts, or a model name in ``MODEL_NAMES``.
    """
    name = _model_name(path)
    if name is not None:
        return MODEL_NAMES[name]()
    path = Path(path)  # type: ignore[arg-type]
    if path.is_dir():
        folder = _diffusers_folder(path)
        return _checkpoint_config(folder / "config.json", lambda: _folder_names(folder))
    if path.is_file():
        return _checkpoint_config(path.parent / "config.json", lambda: _checkpoint_names(path))
    raise FileNotFoundError(f"no model at {path} (nor a model name: {sorted(MODEL_NAMES)})")


PYTORCH_SUFFIXES = (".pth", ".pt", ".ckpt")


def _checkpoint_names(path: Path) -> list[str]:
    """The tensor names of one checkpoint file, without reading its tensors (a ``.pth`` is mapped)."""
    if path.suffix in PYTORCH_SUFFIXES:
        return list(_torch_state(path))
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return list(f.keys())


def _folder_names(folder: Path) -> list[str]:
    return [name for file in _folder_weights(folder) for name in _checkpoint_names(file)]


# -- writing ------------------------------------------------------------------------------------
def _write_folder(out_dir: Path, config: VAEConfig, tensors: dict[str, Any]) -> Path:
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    # reshape: ascontiguousarray makes a 0-d array (LTX's timestep multiplier) 1-d.
    save_file({n: np.ascontiguousarray(t).reshape(np.shape(t)) for n, t in tensors.items()},
              str(out_dir / WEIGHTS_NAME))
    return out_dir


def iter_diffusers_tensors(vae: VAE) -> Iterator[tuple[str, np.ndarray]]:
    """Every weight (decoder, then encoder if any) in diffusers' names and layouts, float32; for
    LTX, then the latents' statistics (diffusers' ``latents_mean`` / ``latents_std`` buffers)."""
    for state in (vae.state, vae.encoder_state):
        for path, var in nnx.to_flat_state(state) if state is not None else ():
            yield keys.diffusers_key(path), keys.to_torch(var, np.asarray(var[...], np.float32))
    if hasattr(vae.config, "with_statistics"):
        statistics = getattr(vae.config, "statistics", None)
        z = vae.config.z_dim
        mean, std = statistics if statistics else ((0.0,) * z, (1.0,) * z)
        yield from zip(STATISTICS_TENSORS, (np.asarray(mean, np.float32), np.asarray(std, np.float32)), strict=True)


def save_vae(vae: VAE, out_dir: str | Path) -> Path:
    """Write a diffusers-format folder (float32 safetensors + config.json): decoder and, if the
    model has one, encoder."""
    return _write_folder(Path(out_dir), vae.config, dict(iter_diffusers_tensors(vae)))


def convert_checkpoint(in_path: str | Path, out_dir: str | Path, *, config: VAEConfig | None = None) -> Path:
    """Turn an original release's checkpoint — Wan's ``Wan2.1_VAE.pth`` / ``Wan2.2_VAE.pth``,
    HunyuanVideo's ``vae/pytorch_model.pt``, HunyuanVideo 1.5's ``vae/diffusion_pytorch_model.safetensors``,
    Lightricks' LTX-Video / LTX-2 single files (``ltx_release_config``), an SD/SDXL/Flux checkpoint in
    latent diffusion's names — into a diffusers folder that loads without torch (``config``: default,
    the real config of the release the names belong to).

    Every tensor (encoder included) is renamed to diffusers' names and kept in its dtype, so the
    folder also loads in diffusers' ``from_pretrained``.
    """
    in_path = Path(in_path)
    tensors = _read_pth(in_path) if in_path.suffix in PYTORCH_SUFFIXES else _read_safetensors([in_path])
    names = list(tensors)
    if not (_is_original_naming(names) or _is_original_hunyuan15_naming(names) or _without_vae_prefix(names)
            or _is_original_ltx_naming(names) or _ldm_prefix(names) is not None or in_path.suffix in PYTORCH_SUFFIXES):
        raise ValueError(f"{in_path} does not look like an original release's VAE state dict (no Wan "
                         "decoder.middle.*, HunyuanVideo 1.5 or latent diffusion decoder.mid.*, LTX vae.*.res_blocks.* "
                         "or vae.* keys; nor a PyTorch file)")
    config = config or config_for_names(names)
    renamed = to_diffusers_names(tensors, config)
    build_vae(config, renamed, dtype="float32", metadata={"source": str(in_path)})  # fail before writing
    return _write_folder(Path(out_dir), config, renamed)
