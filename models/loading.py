"""Load a VAE — Wan 2.1 / 2.2, HunyuanVideo 1.0 / 1.5, LTX-Video, LTX-2, and the image VAEs (AutoencoderKL:
SD, SDXL, Flux.1; Flux.2; Qwen-Image) — from diffusers folders, safetensors files or the original releases'
checkpoints.

The family comes from the config's ``_class_name`` (``models.registry.config_from_dict``), or, for a
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
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import keys
from .conditions import PIPELINE_DEFAULTS
from .config import ConfigError, VAEConfig
from .family_modules import family_modules
from .registry import (
    DEFAULT_MODEL,
    EMBEDDED,
    FAMILIES,
    config_from_dict,
    default_config,
    embedded_model,
    family_of,
    known_class_name,
    read_config,
)
from .vae import VAE, abstract_module, init_vae, resolve_dtype

log = logging.getLogger("vaeserve.models")

DEFAULT_SEED = 0
# Embedded models by name (``models.registry.EMBEDDED``): their configs need no checkpoint (planning
# compiles from shapes alone), and ``load_vae(name)`` builds them with seeded random weights.
MODEL_NAMES: dict[str, Any] = {name: model.config for name, model in EMBEDDED.items()}
WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
INDEX_NAME = WEIGHTS_NAME + ".index.json"
# The encoder's tensors: optional as a whole (a decode-only checkpoint has none of them).
ENCODER_PREFIXES = ("encoder.", "quant_conv.")
# Tensors a checkpoint may hold that are no weights of the model: passed over. (Flux.2's BatchNorm
# counts its training batches; diffusers initialises the count to 0 where a checkpoint lacks it.)
IGNORED_TENSORS = frozenset({"bn.num_batches_tracked"})


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


def config_for_names(names) -> VAEConfig:
    """The real config of the family (and release) whose tensor names these are, for a checkpoint
    without a diffusers ``config.json``: the first family (``models.registry.FAMILIES``, in order)
    whose ``weights`` claim them as an original release's names (latent diffusion's for the
    AutoencoderKL family), else as diffusers' names; by default Wan 2.1 (whose names Qwen-Image's
    share: a Qwen-Image file needs its config.json beside it)."""
    names = list(names)
    for kind in ("release_config", "diffusers_config"):
        for family in FAMILIES:
            weights = family.part("weights")
            if weights is not None and (config := getattr(weights, kind)(names)) is not None:
                return config
    return default_config()


def is_release_naming(names) -> bool:
    """Whether a family claims these tensor names as an original release's."""
    names = list(names)
    return any((weights := family.part("weights")) is not None and weights.release_config(names) is not None
               for family in FAMILIES)


def to_diffusers_names(tensors: dict[str, Any], config: VAEConfig) -> dict[str, Any]:
    """Checkpoint tensors under diffusers' names, renamed by the config's family (``weights``) from an
    original release's names; a ``vae.`` prefix (HunyuanVideo's checkpoint) dropped, with whatever
    else such a checkpoint holds; diffusers' names unchanged."""
    weights = family_of(config).part("weights")
    renamed = weights.to_diffusers_names(tensors, config) if weights is not None else None
    if renamed is not None:
        return renamed
    if any(n.startswith("vae.") for n in tensors):
        return {n.removeprefix("vae."): t for n, t in tensors.items() if n.startswith("vae.")}
    return tensors


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
    """A checkpoint's statistics tensors (an LTX config's ``statistics_tensors``: diffusers' buffers
    ``latents_mean`` / ``latents_std``) moved into its config; the other tensors. Other families keep
    their statistics in the config itself."""
    statistics = getattr(config, "statistics_tensors", ())
    if not statistics or not hasattr(config, "with_statistics"):
        return config, tensors
    rest = {n: t for n, t in tensors.items() if n not in statistics}
    if all(n in tensors for n in statistics):
        config = config.with_statistics(*(np.asarray(tensors[n], np.float32).reshape(-1) for n in statistics))
    return config, rest


def build_vae(config: VAEConfig, tensors: dict[str, Any], *, dtype: str, metadata: dict[str, Any]) -> VAE:
    """Assemble a ``VAE`` of the config's family from diffusers-named tensors; every key problem is
    reported at once.

    The encoder is built when any ``encoder.*``/``quant_conv.*`` tensor is present, else left out
    (also, with a warning, when this implementation cannot run the config's encoder).
    """
    target = resolve_dtype(dtype)
    family = family_modules(config)
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
    model = embedded_model(name)
    config = model.config()
    log.warning("using the embedded %s VAE with RANDOM weights (seed %d): it decodes noise, not %s",
                name, DEFAULT_SEED, "images" if config.is_image else "video")
    metadata = {"name": name,
                "source": f"embedded default ({model.title} architecture, random weights, seed {DEFAULT_SEED})"}
    if weights_cache is None:
        return init_vae(config, seed=DEFAULT_SEED, dtype=dtype, metadata=metadata)
    folder = Path(weights_cache) / f"{name}-random-weights-seed{DEFAULT_SEED}"
    return kept_random_vae(config, folder, seed=DEFAULT_SEED, dtype=dtype, metadata=metadata)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_abandoned_partials(folder: Path) -> list[Path]:
    """Remove the half-written copies of ``folder`` (``.<name>.<pid>.partial``) whose writer is gone
    (killed while it wrote them); a live writer's is left to it. Returns what was removed."""
    removed = []
    for partial in folder.parent.glob(f".{folder.name}.*.partial"):
        pid = partial.name.removeprefix(f".{folder.name}.").removesuffix(".partial")
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)
            removed.append(partial)
            log.info("removed %s, left by a process that ended while writing it", partial)
    return removed


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
    remove_abandoned_partials(folder)
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
        if known_class_name(raw.get("_class_name", default_config().class_name)):
            return config_from_dict(raw)
        names = list(read_names())
        if not is_release_naming(names):
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
    if names := getattr(vae.config, "statistics_tensors", ()):
        statistics = getattr(vae.config, "statistics", None)
        z = vae.config.z_dim
        mean, std = statistics if statistics else ((0.0,) * z, (1.0,) * z)
        yield from zip(names, (np.asarray(mean, np.float32), np.asarray(std, np.float32)), strict=True)


def save_vae(vae: VAE, out_dir: str | Path) -> Path:
    """Write a diffusers-format folder (float32 safetensors + config.json): decoder and, if the
    model has one, encoder."""
    return _write_folder(Path(out_dir), vae.config, dict(iter_diffusers_tensors(vae)))


def convert_checkpoint(in_path: str | Path, out_dir: str | Path, *, config: VAEConfig | None = None) -> Path:
    """Turn an original release's checkpoint — Wan's ``Wan2.1_VAE.pth`` / ``Wan2.2_VAE.pth``,
    HunyuanVideo's ``vae/pytorch_model.pt``, HunyuanVideo 1.5's ``vae/diffusion_pytorch_model.safetensors``,
    Lightricks' LTX-Video / LTX-2 single files, an SD/SDXL/Flux checkpoint in
    latent diffusion's names — into a diffusers folder that loads without torch (``config``: default,
    the real config of the release the names belong to).

    Every tensor (encoder included) is renamed to diffusers' names and kept in its dtype, so the
    folder also loads in diffusers' ``from_pretrained``.
    """
    in_path = Path(in_path)
    tensors = _read_pth(in_path) if in_path.suffix in PYTORCH_SUFFIXES else _read_safetensors([in_path])
    names = list(tensors)
    if not (is_release_naming(names) or any(n.startswith("vae.") for n in names) or in_path.suffix in PYTORCH_SUFFIXES):
        raise ValueError(f"{in_path} does not look like an original release's VAE state dict (no Wan "
                         "decoder.middle.*, HunyuanVideo 1.5 or latent diffusion decoder.mid.*, LTX vae.*.res_blocks.* "
                         "or vae.* keys; nor a PyTorch file)")
    config = config or config_for_names(names)
    renamed = to_diffusers_names(tensors, config)
    build_vae(config, renamed, dtype="float32", metadata={"source": str(in_path)})  # fail before writing
    return _write_folder(Path(out_dir), config, renamed)
