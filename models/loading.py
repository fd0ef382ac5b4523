"""Load a Wan 2.1 or 2.2 VAE from diffusers folders, safetensors files or the original ``.pth``.

The decoder's tensors must all be there. The encoder's (``encoder.*``, ``quant_conv.*``) are
loaded when the checkpoint has any of them (and must then all be there); a decode-only
checkpoint loads for decoding, and ``encode`` then says that it has no encoder.

Accepted ``path``s:
  * a diffusers folder: ``config.json`` + ``diffusion_pytorch_model.safetensors`` (or the sharded
    ``diffusion_pytorch_model.safetensors.index.json`` form);
  * a pipeline folder (``model_index.json`` + ``vae/``), or any folder with a ``vae/`` subfolder;
  * the original Wan release file ``Wan2.1_VAE.pth`` / ``Wan2.2_VAE.pth`` (needs torch; read with
    ``weights_only=True``) or a ``.safetensors`` file in either naming; a ``config.json`` beside it
    is used when present, else the real config of the release its key names belong to;
  * an embedded model name, ``"wan2.1"`` (also ``None``) or ``"wan2.2"``: the real architecture
    with deterministic seeded random weights. It decodes noise and says so (logs,
    ``vae.metadata["random_weights"]``). A folder with such a name loads as ``"./wan2.2"``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import keys
from .config import ConfigError, WanVAEConfig
from .decoder import WanDecoder
from .encoder import WanEncoder, check_encoder_config
from .vae import WanVAE, abstract_module, init_vae, resolve_dtype

log = logging.getLogger("vaeserve.models")

DEFAULT_SEED = 0
# Architectures by name: their configs need no checkpoint (planning compiles from shapes alone), and
# ``load_vae(name)`` builds them with seeded random weights (the embedded models).
MODEL_NAMES: dict[str, Callable[[], WanVAEConfig]] = {"wan2.1": WanVAEConfig, "wan2.2": WanVAEConfig.wan22}
DEFAULT_MODEL = "wan2.1"
WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
INDEX_NAME = WEIGHTS_NAME + ".index.json"
# The encoder's tensors: optional as a whole (a decode-only checkpoint has none of them).
ENCODER_PREFIXES = ("encoder.", "quant_conv.")


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
    for wrapper in ("state_dict", "model"):
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
    return any(n.startswith(("decoder.middle.", "decoder.upsamples.", "conv2.")) for n in names)


def original_release_config(names) -> WanVAEConfig:
    """The real config of the original release whose key names these are: Wan 2.2's blocks nest
    their layers (``decoder.upsamples.0.upsamples.0.*``), Wan 2.1's are flat."""
    nested = re.compile(r"decoder\.upsamples\.\d+\.upsamples\.")
    return WanVAEConfig.wan22() if any(nested.match(n) for n in names) else WanVAEConfig()


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
def _parameters(module_type, config: WanVAEConfig, dtype) -> tuple[Any, dict[str, tuple]]:
    """``(graphdef, {diffusers name: (path, abstract variable)})`` of a module, without computing weights."""
    graphdef, state = nnx.split(abstract_module(module_type, config, dtype))
    return graphdef, {keys.diffusers_key(path): (path, var) for path, var in nnx.to_flat_state(state)}


def _misshaped(expected: dict[str, tuple], tensors: dict[str, Any]) -> list[str]:
    problems = []
    for name, (path, var) in expected.items():
        if name in tensors:
            want = keys.torch_shape(path, var.shape)
            got = tuple(np.shape(tensors[name]))
            if got != want:
                problems.append(f"{name}: expected {want}, received {got}")
    return problems


def _assemble(graphdef, expected: dict[str, tuple], tensors: dict[str, Any], target) -> Any:
    leaves = []
    for name, (path, var) in expected.items():
        array = keys.from_torch(path, np.asarray(tensors[name]), var.shape)
        leaves.append((path, var.replace(jnp.asarray(array, target))))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def build_vae(config: WanVAEConfig, tensors: dict[str, Any], *, dtype: str, metadata: dict[str, Any]) -> WanVAE:
    """Assemble a ``WanVAE`` from diffusers-named tensors; every key problem is reported at once.

    The encoder is built when any ``encoder.*``/``quant_conv.*`` tensor is present, else left out
    (also, with a warning, when this implementation cannot run the config's encoder).
    """
    target = resolve_dtype(dtype)
    graphdef, expected = _parameters(WanDecoder, config, target)
    with_encoder = any(n.startswith(ENCODER_PREFIXES) for n in tensors)
    if with_encoder:
        try:
            check_encoder_config(config)
        except ConfigError as e:
            log.warning("encoder weights skipped: %s", e)
            metadata = {**metadata, "no_encoder_reason": str(e)}
            tensors = {n: t for n, t in tensors.items() if not n.startswith(ENCODER_PREFIXES)}
            with_encoder = False
    encoder_graphdef, encoder_expected = _parameters(WanEncoder, config, target) if with_encoder else (None, {})
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
    return WanVAE(config, model, dtype=dtype, metadata=metadata, encoder=encoder)


def _model_name(path: str | Path | None) -> str | None:
    """The model name ``path`` stands for (None: ``DEFAULT_MODEL``), or None for a real path.
    Only strings are names: ``Path("wan2.2")`` or ``"./wan2.2"`` is a folder."""
    if path is None:
        return DEFAULT_MODEL
    return path if isinstance(path, str) and path in MODEL_NAMES else None


def embedded_vae(name: str = DEFAULT_MODEL, dtype: str = "float32", *,
                 weights_cache: str | Path | None = None) -> WanVAE:
    """The model ``name`` (``MODEL_NAMES``): the real architecture with seeded random weights.

    ``weights_cache``: a folder where the drawn weights are kept (``<name>-random-weights-seed<seed>/``,
    see ``kept_random_vae``), so that a later start reads them instead of drawing them again
    (the real Wan 2.1's take about 10 s to draw on 2 cores).
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"no embedded model {name!r}; expected one of {sorted(MODEL_NAMES)}")
    version = name.removeprefix("wan")
    log.warning("using the embedded %s VAE with RANDOM weights (seed %d): it decodes noise, not video",
                name, DEFAULT_SEED)
    config = MODEL_NAMES[name]()
    metadata = {"name": name,
                "source": f"embedded default (Wan {version} architecture, random weights, seed {DEFAULT_SEED})"}
    if weights_cache is None:
        return init_vae(config, seed=DEFAULT_SEED, dtype=dtype, metadata=metadata)
    folder = Path(weights_cache) / f"{name}-random-weights-seed{DEFAULT_SEED}"
    return kept_random_vae(config, folder, seed=DEFAULT_SEED, dtype=dtype, metadata=metadata)


def kept_random_vae(config: WanVAEConfig, folder: Path, *, seed: int, dtype: str = "float32",
                    metadata: dict[str, Any] | None = None) -> WanVAE:
    """``init_vae(config, seed=seed)``, its weights kept in ``folder`` (a diffusers folder, float32).

    Read back when ``folder`` holds ``config``'s weights; else drawn and written there. The folder
    appears complete or not at all (written beside it, then renamed), so processes sharing it never
    read half a file. One that cannot be read or holds another config is drawn again; one that
    cannot be written costs only the next start the drawing.
    """
    metadata = {**(metadata or {}), "random_weights": True}
    if folder.is_dir():
        try:
            if WanVAEConfig.from_json(folder / "config.json") == config:
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


def load_vae(path: str | Path | None = None, dtype: str = "float32", *,
             embedded_weights_cache: str | Path | None = None) -> WanVAE:
    """Load a Wan 2.1 or 2.2 VAE (see the module docstring for the accepted ``path``s);
    ``embedded_weights_cache``: where an embedded model keeps its drawn weights (``embedded_vae``)."""
    resolve_dtype(dtype)
    name = _model_name(path)
    if name is not None:
        return embedded_vae(name, dtype, weights_cache=embedded_weights_cache)
    path = Path(path)  # type: ignore[arg-type]
    if path.is_dir():
        folder = _diffusers_folder(path)
        config = WanVAEConfig.from_json(folder / "config.json")
        tensors = _read_safetensors(_folder_weights(folder))
    elif path.is_file():
        tensors = _read_pth(path) if path.suffix in (".pth", ".pt", ".ckpt") else _read_safetensors([path])
        config_file = path.parent / "config.json"
        if config_file.is_file():
            config = WanVAEConfig.from_json(config_file)
        else:
            config = original_release_config(tensors) if _is_original_naming(tensors) else WanVAEConfig()
        if _is_original_naming(tensors):
            tensors = {keys.original_to_diffusers(n, config.num_res_blocks): t for n, t in tensors.items()}
    else:
        raise FileNotFoundError(f"no model at {path}")
    log.info("loading Wan VAE from %s (%s)", path, dtype)
    return build_vae(config, tensors, dtype=dtype, metadata={"source": str(path), "random_weights": False})


def load_config(path: str | Path | None = None) -> WanVAEConfig:
    """The config ``load_vae(path)`` would build, read without loading any tensor.

    ``path`` is anything ``load_vae`` accepts, or a model name in ``MODEL_NAMES``.
    """
    name = _model_name(path)
    if name is not None:
        return MODEL_NAMES[name]()
    path = Path(path)  # type: ignore[arg-type]
    if path.is_dir():
        return WanVAEConfig.from_json(_diffusers_folder(path) / "config.json")
    if path.is_file():
        config_file = path.parent / "config.json"
        if config_file.is_file():
            return WanVAEConfig.from_json(config_file)
        names = _checkpoint_names(path)
        return original_release_config(names) if _is_original_naming(names) else WanVAEConfig()
    raise FileNotFoundError(f"no model at {path} (nor a model name: {sorted(MODEL_NAMES)})")


def _checkpoint_names(path: Path) -> list[str]:
    """The tensor names of one checkpoint file, without reading its tensors (a ``.pth`` is mapped)."""
    if path.suffix in (".pth", ".pt", ".ckpt"):
        return list(_torch_state(path))
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return list(f.keys())


# -- writing ------------------------------------------------------------------------------------
def _write_folder(out_dir: Path, config: WanVAEConfig, tensors: dict[str, Any]) -> Path:
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    save_file({n: np.ascontiguousarray(t) for n, t in tensors.items()}, str(out_dir / WEIGHTS_NAME))
    return out_dir


def iter_diffusers_tensors(vae: WanVAE) -> Iterator[tuple[str, np.ndarray]]:
    """Every weight (decoder, then encoder if any) in diffusers' names and layouts, float32."""
    for state in (vae.state, vae.encoder_state):
        for path, var in nnx.to_flat_state(state) if state is not None else ():
            yield keys.diffusers_key(path), keys.to_torch(path, np.asarray(var[...], np.float32))


def save_vae(vae: WanVAE, out_dir: str | Path) -> Path:
    """Write a diffusers-format folder (float32 safetensors + config.json): decoder and, if the
    model has one, encoder."""
    return _write_folder(Path(out_dir), vae.config, dict(iter_diffusers_tensors(vae)))


def convert_wan_pth(in_path: str | Path, out_dir: str | Path, *, config: WanVAEConfig | None = None) -> Path:
    """Turn the original ``Wan2.1_VAE.pth`` or ``Wan2.2_VAE.pth`` into a diffusers folder that
    loads without torch (``config``: default, the real config of the release the keys belong to).

    Every tensor (encoder included) is renamed to diffusers' names and kept in its dtype, so the
    folder also loads in diffusers' ``AutoencoderKLWan.from_pretrained``.
    """
    tensors = _read_pth(Path(in_path))
    if not _is_original_naming(tensors):
        raise ValueError(f"{in_path} does not look like an original Wan VAE state dict (no decoder.middle.* keys)")
    config = config or original_release_config(tensors)
    renamed = {keys.original_to_diffusers(n, config.num_res_blocks): t for n, t in tensors.items()}
    build_vae(config, renamed, dtype="float32", metadata={"source": str(in_path)})  # fail before writing
    return _write_folder(Path(out_dir), config, renamed)
