"""Helpers for the sharding tests: the tiny model configs and deterministic latents."""

import importlib.util

import numpy as np

TINY = dict(base_dim=8, num_res_blocks=1)
# Wan 2.2 in small: residual up blocks, a time+space and a space-only DupUp3D shortcut, 2x2
# unpatchify, 48 latent channels; three stages (8x spatial, 2x temporal) to keep compiles short.
TINY22 = dict(base_dim=8, decoder_base_dim=8, num_res_blocks=1, dim_mult=(1, 2, 2), temperal_downsample=(False, True),
              scale_factor_spatial=8, scale_factor_temporal=2)
WIDTH = 4  # latent width for the height-split tests: never divisible by 3, so splits are forced


def make_latents(batch: int, frames: int, height: int, width: int, seed: int = 0, channels: int = 16) -> np.ndarray:
    """``(B, C, T, H, W)`` float32 standard-normal latents, deterministic in the shape and seed."""
    rng = np.random.default_rng([seed, batch, frames, height, width])
    return rng.standard_normal((batch, channels, frames, height, width)).astype(np.float32)


def assert_one_row_permutes(found: list[dict]) -> list[dict]:
    """The collective-permutes of a program split by height (``sharding.introspect.collectives``)
    all move one row: ``(B, T, 1, W, C)``. (Checking that *some* size is 1 proves nothing when B or
    T is 1.) Returns them."""
    permutes = [c for c in found if c["op"] == "collective-permute"]
    assert permutes and all(c["shape"][2] == 1 for c in permutes), permutes
    return permutes


def assert_halo_collectives(found: list[dict], latent_hw: tuple[int, ...]) -> list[dict]:
    """The collectives of a compiled program split by height (``sharding.introspect.collectives``):
    one-row collective-permutes ``(B, T, 1 row, W, C)``, all-gathers of latent-resolution K/V
    only (``(..., H, W, C)`` at the latents' ``latent_hw``); nothing else (a decode's non-finite
    counts leave the program per band: no all-reduce). Returns the permutes."""
    permutes = assert_one_row_permutes(found)
    gathers = [c for c in found if c["op"] == "all-gather"]
    assert gathers and all(tuple(c["shape"][-3:-1]) == tuple(latent_hw) for c in gathers), gathers
    others = [c for c in found if c["op"] not in ("collective-permute", "all-gather")]
    assert not others, others
    return permutes


def assert_halo_and_statistics_collectives(found: list[dict], latent_hw: tuple[int, ...], *, batch: int,
                                           groups: int) -> list[dict]:
    """``assert_halo_collectives`` for a model whose GroupNorm statistics span the whole frame
    (HunyuanVideo 1.0): beside the halos and K/V, all-reduces of float32 per-group statistics
    ``(B, groups)`` and nothing larger (no activation, no count). Returns the all-reduces."""
    reduces = [c for c in found if c["op"] == "all-reduce"]
    assert reduces and all(c["dtype"] == "f32" and c["shape"] == (batch, groups) for c in reduces), reduces
    assert_halo_collectives([c for c in found if c["op"] != "all-reduce"], latent_hw)
    return reduces


def assert_memory_split_over_tp(programs: dict, tp: int, *, temp_at_most: float) -> None:
    """Per-device memory of the same decode compiled at tp = 1 and ``tp``: temp bytes shrink to at
    most ``temp_at_most`` x tp = 1's; each device holds 1/tp of the frames."""
    from vaeserve.sharding.introspect import program_memory

    memory = {n: program_memory(compiled) for n, compiled in programs.items()}
    assert 0 < memory[tp]["temp_bytes"] <= temp_at_most * memory[1]["temp_bytes"], memory
    assert_output_split_over_tp(memory[1]["output_bytes"], memory[tp]["output_bytes"], tp)


# A decode's outputs beside its frames: the (B,)/(B, 1) int32 non-finite counts and the output
# tuple's table, the same few bytes on every device and at every tp (20 on CPU; TPU lays the
# counts out in a padded tile: 1 KiB; at most one (8, 128) int32 tile).
OUTPUT_OVERHEAD_BYTES = 4096


def assert_output_split_over_tp(whole: int, per_device: int, tp: int) -> None:
    """Each of ``tp`` devices outputs 1/tp of the frames plus the same small overhead ``c``:
    ``whole = F + c`` and ``per_device = F/tp + c``, so ``c = (tp·per_device − whole)/(tp − 1)``."""
    overhead, remainder = divmod(tp * per_device - whole, tp - 1)
    assert remainder == 0 and 0 < overhead <= OUTPUT_OVERHEAD_BYTES, (whole, per_device, tp)
    assert (whole - overhead) % tp == 0 and whole - overhead >= 100 * overhead, (whole, per_device, tp)


def cuda_compiler_installed() -> bool:
    """Whether XLA's CUDA compiler (the ``cuda`` extra's plugin) can be loaded here."""
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda13") is not None
    except ModuleNotFoundError:  # no jax_plugins namespace at all
        return False
