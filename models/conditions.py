"""Decode conditions: what a decoder may take besides its latents — a diffusion timestep, a noise
scale and the noise's seed (LTX-Video 0.9.1+ and LTX-2 take them). A family declares the conditions
its decoders take (``FamilyDescriptor.conditions``); a config says which of them it takes
(``decode_conditions``, and ``timestep_conditioning`` for a decoder that only injects noise). The
rules, ranges and defaults are here, once: the Python API (``models.decode.decode_conditions``) and
the HTTP layer (which imports no JAX) check them with ``refused_conditions``. Imports no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

# The timestep a pipeline passes to a timestep-conditioned decoder when nobody says otherwise
# (Lightricks' published inference configs and the LTX-Video documentation use 0.05).
DEFAULT_DECODE_TIMESTEP = 0.05
# The timesteps a decode takes: pipelines decode at a flow-matching sigma, ``decode_timestep`` in [0, 1].
TIMESTEP_RANGE = (0.0, 1.0)
# Seeds (a decode's noise, an encode's sample): jax.random.PRNGKey keeps 32 bits of a seed without x64.
SEED_RANGE = 2**32
# A pipeline folder's ``model_index.json`` may state a decode's defaults (the LTX pipelines' call
# arguments): kept in ``vae.metadata``.
PIPELINE_DEFAULTS = ("decode_timestep", "decode_noise_scale")


@dataclasses.dataclass(frozen=True)
class Condition:
    """One decode condition: its query/keyword ``name``, the half-open or closed ``range`` of its values
    (None: any), and what it is, in words."""

    name: str
    range: tuple[float, float] | None
    description: str


TIMESTEP = Condition("timestep", TIMESTEP_RANGE, "the decode timestep of a timestep-conditioned decoder "
                     "(default: the checkpoint's decode_timestep, else 0.05)")
NOISE_SCALE = Condition("noise_scale", (0.0, 1.0), "noise mixed into the latents before decoding: "
                        "(1 - s) z + s noise (default: the checkpoint's decode_noise_scale, else 0)")
SEED = Condition("seed", (0, SEED_RANGE), "the noise's seed (default: a fresh one)")
# Bytes per row of a compiled decode's ``DecodeConditions``: float32 timestep and noise scale, a uint32 key pair.
CONDITION_BYTES = 4 + 4 + 2 * 4


def condition_defaults(defaults: dict[str, Any] | None) -> tuple[float, float]:
    """``(timestep, noise_scale)`` of a decode that names neither: the checkpoint's pipeline's
    ``decode_timestep`` and ``decode_noise_scale`` (``defaults``: ``vae.metadata``), else the
    pipelines' 0.05 and 0 (the latents as given)."""
    defaults = defaults or {}
    return (float(defaults.get("decode_timestep", DEFAULT_DECODE_TIMESTEP)),
            float(defaults.get("decode_noise_scale", 0.0)))


class RefusedConditions(NamedTuple):
    """Decode conditions given to a decoder that does not take them: why, what it takes, what came."""

    detail: str
    expected: str
    received: dict[str, float]


def conditions_taken(config: Any) -> tuple[str, ...]:
    """The conditions ``config``'s decoder takes: none (``decode_conditions`` false), the seed of the
    noise it injects, or also a timestep and a noise scale (``timestep_conditioning``)."""
    if not config.decode_conditions:
        return ()
    if getattr(config, "timestep_conditioning", False):
        return (TIMESTEP.name, NOISE_SCALE.name, SEED.name)
    return (SEED.name,)


def refused_conditions(config: Any, *, timestep: float | None, noise_scale: float | None,
                       seed: int | None) -> RefusedConditions | None:
    """The conditions given (not None) that ``config``'s decoder does not take, or None when it takes
    them all: any of the three for a decoder that takes none (``decode_conditions``); a timestep or
    a noise scale for one that only injects noise (it takes a seed only). The one rule of the
    Python API (``models.decode.decode_conditions``) and of the HTTP layer (which imports no JAX)."""
    given: dict[str, float] = {name: value for name, value in (("timestep", timestep), ("noise_scale", noise_scale),
                                                              ("seed", seed)) if value is not None}
    if not config.decode_conditions:
        return RefusedConditions(f"the {config.class_name} decoder takes no timestep and draws no noise",
                                 "no timestep, noise_scale or seed", given) if given else None
    unconditioned: dict[str, float] = {name: given[name] for name in ("timestep", "noise_scale") if name in given}
    if unconditioned and not getattr(config, "timestep_conditioning", False):
        return RefusedConditions(f"the {config.class_name} decoder is not timestep-conditioned",
                                 "seed only", unconditioned)
    return None


class DecodeConditions(NamedTuple):
    """Per-row arguments of a decode of a decoder that takes conditions (a pytree of arrays, so one
    compiled program serves every value; per row, so requests with different values share a batch).

    Attributes:
      timestep: ``(B,)`` float32, the decode timestep of a timestep-conditioned decoder.
      noise_scale: ``(B,)`` float32, the pipelines' ``decode_noise_scale``: latents become
        ``(1 − s)·z + s·noise`` before decoding (0: as given).
      keys: ``(B, 2)`` uint32, ``jax.random.PRNGKey(seed)`` of the row's noise: the latents' noise
        and the noise the decoder's resnets inject (``frame_noise``).
    """

    timestep: Any
    noise_scale: Any
    keys: Any

    @staticmethod
    def avals(batch: int, sharding=None) -> DecodeConditions:
        import jax  # here: this module imports without JAX (the HTTP layer reads the ranges above)
        import jax.numpy as jnp

        def aval(shape, dtype):
            return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
        return DecodeConditions(aval((batch,), jnp.float32), aval((batch,), jnp.float32), aval((batch, 2), jnp.uint32))

    @staticmethod
    def concatenate(parts: list[DecodeConditions], batch: int) -> DecodeConditions:
        """Host conditions of several requests stacked, then padded to ``batch`` rows with zeros
        (timestep 0, no latent noise: rows of padding, whose frames are dropped)."""
        fields = [np.concatenate([np.asarray(getattr(p, name)) for p in parts]) for name in DecodeConditions._fields]
        missing = batch - len(fields[0])
        return DecodeConditions(*(np.concatenate([f, np.zeros((missing, *f.shape[1:]), f.dtype)]) for f in fields))
