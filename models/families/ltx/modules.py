"""The LTX-Video and LTX-2 decoder and encoder modules, built from the shared layers (``models.families.ltx.layers``)
by each config's plan (``models.families.ltx.config``).

The decoder streams (``models.families.ltx.layers`` explains how): called with ``caches=None`` on the clip's first
``1 + lookahead`` latent frames (``clip_frames``: the clip's length), then with the caches it
returned on ``chunk`` latent frames at a time — zeros once the clip has ended — until every frame
is out (``models.decode`` runs that loop). The encoder is causal: frame 0 alone, then chunks of
``temporal_scale`` frames, as Wan's.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from vaeserve.models.conditions import DecodeConditions
from vaeserve.models.config import ConfigError
from vaeserve.models.conv import downsample2x_causal_conv3x3x3
from vaeserve.models.decode import StreamStart
from vaeserve.models.layers import patchify, scoped, unpatchify
from vaeserve.models.spatial import SpatialContext, check_edge

from .config import DecoderPlan, DownBlockPlan, EncoderPlan, LTX2VideoConfig, LTXVideoConfig, UpBlockPlan
from .layers import (
    LATENT_NOISE,
    Conv,
    Resnet,
    Step,
    TimeEmbedder,
    Upsampler,
    Weights,
    pixel_norm,
    space_to_depth,
)


class Clock(NamedTuple):
    """Where a stream is: latent frames taken so far and the clip's latent frames, each
    ``(B, 1, 1, 1, 1)`` int32 (shaped like a band of a cache; every band keeps its copy)."""

    fed: jax.Array
    clip: jax.Array


def _resnets(count: int, width: int, plan: DecoderPlan, scale: int, eps: float, *, noise: bool, first_index: int,
             rngs: nnx.Rngs, dtype) -> nnx.List:
    return nnx.List([Resnet(width, width, causal=plan.causal, edge=plan.edge, scale=scale, eps=eps,
                            timestep=plan.timestep_conditioning, noise=noise, noise_index=first_index + i,
                            wrapped_shortcut=plan.conv_shortcut_wrapped, rngs=rngs, dtype=dtype)
                     for i in range(count)])


def _run(resnets, x: jax.Array, caches, ctx: SpatialContext, step: Step, temb, keys) -> tuple[jax.Array, list]:
    new = []
    for i, resnet in enumerate(resnets):
        with jax.named_scope(f"resnets.{i}"):
            x, cache = resnet(x, None if caches is None else caches[i], ctx, step, temb=temb, noise_keys=keys)
        new.append(cache)
    return x, new


class MidBlock(nnx.Module):
    """``LTX(2)VideoMidBlock3d``: (a time embedder, ``4C`` wide) and ``layers`` resnets at latent scale."""

    def __init__(self, plan: DecoderPlan, eps: float, *, rngs: nnx.Rngs, dtype=jnp.float32):
        width = plan.mid_channels
        self.time_embedder = TimeEmbedder(4 * width, rngs=rngs, dtype=dtype) if plan.timestep_conditioning else None
        self.resnets = _resnets(plan.mid_layers, width, plan, 1, eps, noise=plan.mid_noise, first_index=0,
                                rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x, caches, ctx: SpatialContext, step: Step, timestep, keys) -> tuple[jax.Array, tuple]:
        temb = None if self.time_embedder is None else self.time_embedder(timestep)
        x, new = _run(self.resnets, x, caches, ctx, step, temb, keys)
        return x, tuple(new)


class UpBlock(nnx.Module):
    """``LTX(2)VideoUpBlock3d``: (``conv_in``, a resnet that changes the width), (an upsampler), resnets;
    a time embedder ``4·cin`` wide when timestep-conditioned."""

    def __init__(self, block: UpBlockPlan, plan: DecoderPlan, scale: int, eps: float, first_index: int, *,
                 rngs: nnx.Rngs, dtype=jnp.float32):
        conditioned = plan.timestep_conditioning
        self.time_embedder = TimeEmbedder(4 * block.cin, rngs=rngs, dtype=dtype) if conditioned else None
        self.conv_in = (Resnet(block.cin, block.cout, causal=plan.causal, edge=plan.edge, scale=scale, eps=eps,
                               wrapped_shortcut=plan.conv_shortcut_wrapped, rngs=rngs, dtype=dtype)
                        if block.cin != block.cout else None)
        self.upsamplers = nnx.List(
            [Upsampler(block.cout * block.factor, block.stride, residual=block.residual, factor=block.factor,
                       causal=plan.causal, edge=plan.edge, scale=scale, rngs=rngs, dtype=dtype)]
            if block.stride else [])
        after = scale * (block.stride[0] if block.stride else 1)
        self.resnets = _resnets(block.layers, block.cout, plan, after, eps, noise=block.inject_noise,
                                first_index=first_index, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x, caches, ctx: SpatialContext, step: Step, timestep, keys) -> tuple[jax.Array, tuple]:
        conv_in, upsampler, resnets = caches if caches is not None else (None, None, None)
        if self.conv_in is not None:
            with jax.named_scope("conv_in"):
                x, conv_in = self.conv_in(x, conv_in, ctx, step)
        temb = None if self.time_embedder is None else self.time_embedder(timestep)
        for up in self.upsamplers:
            with jax.named_scope("upsamplers.0"):
                x, upsampler = up(x, upsampler, ctx, step)
        x, new = _run(self.resnets, x, resnets, ctx, step, temb, keys)
        return x, (conv_in, upsampler, tuple(new))


class Decoder3d(nnx.Module):
    """conv_in → mid block → up blocks → pixel norm → (scale, shift by the timestep) → SiLU → conv_out
    → unpatchify: latents ``(B, n, H, W, z)`` → frames ``(B, m, s·H, s·W, 3)``."""

    def __init__(self, plan: DecoderPlan, eps: float, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.patch = plan.patch
        self.conv_in = Conv(plan.latent_channels, plan.mid_channels, causal=plan.causal, edge=plan.edge,
                            rngs=rngs, dtype=dtype)
        self.mid_block = MidBlock(plan, eps, rngs=rngs, dtype=dtype)
        blocks, scale, index = [], 1, plan.mid_layers
        for block in plan.up_blocks:
            blocks.append(UpBlock(block, plan, scale, eps, index, rngs=rngs, dtype=dtype))
            scale, index = scale * (block.stride[0] if block.stride else 1), index + block.layers
        self.up_blocks = nnx.List(blocks)
        width = plan.head_channels
        self.conv_out = Conv(width, 3 * plan.patch ** 2, causal=plan.causal, edge=plan.edge, scale=scale,
                             rngs=rngs, dtype=dtype)
        conditioned = plan.timestep_conditioning
        self.timestep_scale_multiplier = (nnx.Param(jnp.full((), 1000.0, jnp.float32), torch_layout="scalar",
                                                    fill=1000.0) if conditioned else None)
        self.time_embedder = TimeEmbedder(2 * width, rngs=rngs, dtype=dtype) if conditioned else None
        self.scale_shift_table = nnx.Param(jnp.zeros((2, width), dtype), torch_layout="table") if conditioned else None

    @scoped
    def __call__(self, z: jax.Array, caches, ctx: SpatialContext, step: Step,
                 conditions: DecodeConditions | None) -> tuple[jax.Array, tuple]:
        layer = caches if caches is not None else (None,) * (3 + len(self.up_blocks))
        keys = None if conditions is None else conditions.keys
        timestep = None
        if self.timestep_scale_multiplier is not None:
            if conditions is None:
                raise ValueError("this decoder is timestep-conditioned: decode it with a timestep")
            timestep = conditions.timestep.astype(jnp.float32) * self.timestep_scale_multiplier[...]
        with jax.named_scope("conv_in"):
            x, conv_in = self.conv_in(z, layer[0], ctx, step)
        with jax.named_scope("mid_block"):
            x, mid = self.mid_block(x, layer[1], ctx, step, timestep, keys)
        ups = []
        for i, block in enumerate(self.up_blocks):
            with jax.named_scope(f"up_blocks.{i}"):
                x, cache = block(x, layer[2 + i], ctx, step, timestep, keys)
            ups.append(cache)
        x = pixel_norm(x)
        if self.time_embedder is not None and self.scale_shift_table is not None and timestep is not None:
            table = (self.time_embedder(timestep).reshape(x.shape[0], 2, -1)
                     + self.scale_shift_table[...].astype(jnp.float32)[None])
            x = (x.astype(jnp.float32) * (1 + table[:, 1, None, None, None]) + table[:, 0, None, None, None]).astype(x.dtype)
        with jax.named_scope("conv_out"):
            x, conv_out = self.conv_out(jax.nn.silu(x), layer[-1], ctx, step)
        return unpatchify(x, self.patch), (conv_in, mid, *ups, conv_out)


class LTXDecoder(nnx.Module):
    """The LTX-Video / LTX-2 decoder (no ``post_quant_conv``): latents ``(B, n, H, W, z)`` → frames.

    ``caches=None``: the clip's first step, ``1 + lookahead`` latent frames (fewer only when the clip
    is shorter; pad it with zeros), ``clip_frames`` the clip's latent frames; or ``caches`` a
    ``StreamStart`` holding the clip's latent frames at run time, ``clip_frames`` then the longest clip
    the program serves (``models.decode.first_step_clip``). Then the returned caches
    with ``chunk`` latent frames per step (zeros past the clip's end). ``conditions``: the rows'
    timestep and noise, for a decoder that takes them (``config.decode_conditions``).
    """

    steps_with_caches = True  # steps with caches (models.family_modules); the frames come ``lookahead`` behind
    needs_clip_frames = True  # the first step records the clip's length (the end of every conv's input)
    runtime_clip_frames = True  # ... taken at run time (``StreamStart``): one first step serves many lengths

    def __init__(self, config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        plan = config.decoder_plan()
        self.temporal_scale = config.temporal_scale
        self.lookahead = config.lookahead
        self.decoder = Decoder3d(plan, config.resnet_norm_eps, rngs=rngs, dtype=dtype)
        # Pipelines mix noise into the latents of a timestep-conditioned decode; LTX-2's before it
        # denormalizes them: in the decoder's terms, noise · std + mean (static: the config's).
        self.latent_noise = plan.timestep_conditioning
        before = getattr(config, "noise_before_denormalize", False)
        self.noise_std = tuple(config.latents_std) if before else None
        self.noise_mean = tuple(config.latents_mean) if before else None

    def _mixed(self, z: jax.Array, conditions: DecodeConditions, fed: jax.Array, ctx: SpatialContext) -> jax.Array:
        """``(1 − s)·z + s·noise`` per row, latent frame ``t``'s noise from ``fold_in(key, t)``."""
        b, n, h, w, c = z.shape

        def frame(t):
            keys = jax.vmap(lambda key: jax.random.fold_in(jax.random.fold_in(key, LATENT_NOISE), fed + t))(
                conditions.keys)
            return ctx.frame_noise(keys, (h, w, c))

        noise = jnp.stack([frame(t) for t in range(n)], axis=1)  # (B, n, h, w, c)
        if self.noise_std is not None and self.noise_mean is not None:
            noise = noise * jnp.asarray(self.noise_std, jnp.float32) + jnp.asarray(self.noise_mean, jnp.float32)
        scale = conditions.noise_scale.astype(jnp.float32)[:, None, None, None, None]
        return ((1 - scale) * z.astype(jnp.float32) + scale * noise).astype(z.dtype)

    @scoped
    def __call__(self, z: jax.Array, caches: tuple[Clock, Any] | StreamStart | None, ctx: SpatialContext, *,
                 inner_frames: int | None = None, clip_frames: int | None = None,
                 conditions: DecodeConditions | None = None) -> tuple[jax.Array, tuple[Clock, Any]]:
        del inner_frames  # a step runs whole
        if caches is None or isinstance(caches, StreamStart):
            if clip_frames is None:
                raise ValueError("the first decode step needs clip_frames (the clip's latent frames)")
            clip = clip_frames if caches is None else caches.clip_frames
            ones = jnp.ones((z.shape[0], 1, 1, 1, 1), jnp.int32)
            clock, layers, step = Clock(0 * ones, clip * ones), None, Step(True, clip, bound=clip_frames)
        else:
            clock, layers = caches
            step = Step(False, clock.clip[0, 0, 0, 0, 0])
        if self.latent_noise and conditions is not None:
            z = self._mixed(z, conditions, clock.fed[0, 0, 0, 0, 0], ctx)
        with jax.named_scope("decoder"):
            frames, layers = self.decoder(z, layers, ctx, step, conditions)
        return frames, (Clock(clock.fed + z.shape[1], clock.clip), layers)


# -- encoder ----------------------------------------------------------------------------------------
class StridedConv(nnx.Module):
    """LTX-Video 0.9.0's downsampler: a causal 3x3x3 conv with stride 2 in time and space (frames
    padded by a row and column on every side), its weights under ``.conv``. Between steps it keeps
    the last frame it took: its next output reads that frame and the next two."""

    def __init__(self, dim: int, *, edge: str, rngs: nnx.Rngs, dtype=jnp.float32):
        self.edge = check_edge(edge)
        self.conv = Weights(dim, dim, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x, cache, ctx: SpatialContext) -> tuple[jax.Array, jax.Array]:
        padded = ctx.pad_hw(x, edge=self.edge)
        y = downsample2x_causal_conv3x3x3(cache, padded, self.conv.kernel[...], self.conv.bias[...], time_stride=2,
                                          start="replicate", native=ctx.native_conv,
                                          rounded_sums=ctx.rounded_conv_sums, onednn=ctx.onednn_conv)
        return y, padded[:, -1:]


class SpaceToDepthDownsampler(nnx.Module):
    """``LTX(2)VideoDownsampler3d``: a causal conv to ``cout / (f·p²)`` channels packed from ``f`` frames
    and ``p x p`` pixels (``space_to_depth``), plus the input packed the same way and averaged over
    groups of ``cin·f·p² / cout`` channels; on the clip's first step its first ``f − 1`` frames are
    taken twice (the reference prepends them)."""

    def __init__(self, cin: int, cout: int, stride: tuple[int, int], *, edge: str, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        self.frames, self.pixels = stride
        self.cout = cout
        self.conv = Conv(cin, cout // (self.frames * self.pixels ** 2), causal=True, edge=edge, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x, cache, ctx: SpatialContext, step: Step) -> tuple[jax.Array, Any]:
        if step.first and self.frames > 1:
            x = jnp.concatenate([x[:, : self.frames - 1], x], axis=1)
        packed = space_to_depth(x, self.frames, self.pixels)
        residual = packed.astype(jnp.float32).reshape(*packed.shape[:-1], self.cout, -1).mean(axis=-1)
        h, cache = self.conv(x, cache, ctx, step)
        return space_to_depth(h, self.frames, self.pixels) + residual.astype(h.dtype), cache


class DownBlock(nnx.Module):
    """``LTXVideoDownBlock3D`` / ``LTXVideo095DownBlock3D`` / ``LTX2VideoDownBlock3D``: resnets at ``cin``,
    then a downsampler (a strided conv followed by a ``conv_out`` resnet to ``cout``, or a
    space-to-depth downsampler to ``cout``)."""

    def __init__(self, block: DownBlockPlan, *, edge: str, eps: float, wrapped_shortcut: bool, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        def resnet(cin, cout):
            return Resnet(cin, cout, causal=True, edge=edge, scale=1, eps=eps, wrapped_shortcut=wrapped_shortcut,
                          rngs=rngs, dtype=dtype)

        self.resnets = nnx.List([resnet(block.cin, block.cin) for _ in range(block.layers)])
        downsampler: list[nnx.Module] = []
        if block.kind == "conv":
            downsampler = [StridedConv(block.cin, edge=edge, rngs=rngs, dtype=dtype)]
        elif block.kind is not None and block.stride is not None:
            downsampler = [SpaceToDepthDownsampler(block.cin, block.cout, block.stride, edge=edge, rngs=rngs,
                                                   dtype=dtype)]
        self.downsamplers = nnx.List(downsampler)
        self.conv_out = resnet(block.cin, block.cout) if block.kind in ("conv", None) and block.cin != block.cout \
            else None

    @scoped
    def __call__(self, x, caches, ctx: SpatialContext, step: Step) -> tuple[jax.Array, tuple]:
        resnet_caches, down, out = caches if caches is not None else (None, None, None)
        x, new = _run(self.resnets, x, resnet_caches, ctx, step, None, None)
        for downsampler in self.downsamplers:
            with jax.named_scope("downsamplers.0"):
                x, down = (downsampler(x, down, ctx) if isinstance(downsampler, StridedConv)
                           else downsampler(x, down, ctx, step))
        if self.conv_out is not None:
            with jax.named_scope("conv_out"):
                x, out = self.conv_out(x, out, ctx, step)
        return x, (tuple(new), down, out)


class Encoder3d(nnx.Module):
    """patchify → conv_in → down blocks → mid block → pixel norm → SiLU → conv_out (``z + 1`` channels:
    the mean, and one log-variance for every channel): frames ``(B, n, H, W, 3)`` → moments
    ``(B, t, H/s, W/s, 2z)``."""

    def __init__(self, plan: EncoderPlan, eps: float, wrapped_shortcut: bool, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.patch, self.latent_channels = plan.patch, plan.latent_channels
        self.conv_in = Conv(3 * plan.patch ** 2, plan.conv_in_channels, causal=True, edge=plan.edge, rngs=rngs,
                            dtype=dtype)
        self.down_blocks = nnx.List([DownBlock(block, edge=plan.edge, eps=eps, wrapped_shortcut=wrapped_shortcut,
                                               rngs=rngs, dtype=dtype) for block in plan.down_blocks])
        self.mid_block = EncoderMidBlock(plan, eps, wrapped_shortcut, rngs=rngs, dtype=dtype)
        self.conv_out = Conv(plan.mid_channels, plan.latent_channels + 1, causal=True, edge=plan.edge, rngs=rngs,
                             dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, caches, ctx: SpatialContext, step: Step) -> tuple[jax.Array, tuple]:
        layer = caches if caches is not None else (None,) * (3 + len(self.down_blocks))
        x = patchify(x, self.patch)
        with jax.named_scope("conv_in"):
            x, conv_in = self.conv_in(x, layer[0], ctx, step)
        downs = []
        for i, block in enumerate(self.down_blocks):
            with jax.named_scope(f"down_blocks.{i}"):
                x, cache = block(x, layer[1 + i], ctx, step)
            downs.append(cache)
        with jax.named_scope("mid_block"):
            x, mid = self.mid_block(x, layer[-2], ctx, step)
        with jax.named_scope("conv_out"):
            h, conv_out = self.conv_out(jax.nn.silu(pixel_norm(x)), layer[-1], ctx, step)
        z = self.latent_channels
        logvar = jnp.broadcast_to(h[..., z:], (*h.shape[:-1], z))
        return jnp.concatenate([h[..., :z], logvar], axis=-1), (conv_in, *downs, mid, conv_out)


class EncoderMidBlock(nnx.Module):
    def __init__(self, plan: EncoderPlan, eps: float, wrapped_shortcut: bool, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.resnets = nnx.List([Resnet(plan.mid_channels, plan.mid_channels, causal=True, edge=plan.edge, scale=1,
                                        eps=eps, wrapped_shortcut=wrapped_shortcut, rngs=rngs, dtype=dtype)
                                 for _ in range(plan.mid_layers)])

    @scoped
    def __call__(self, x, caches, ctx: SpatialContext, step: Step) -> tuple[jax.Array, tuple]:
        x, new = _run(self.resnets, x, caches, ctx, step, None, None)
        return x, tuple(new)


class LTXEncoder(nnx.Module):
    """The LTX-Video / LTX-2 encoder (no ``quant_conv``): frames ``(B, T, H, W, 3)`` in [-1, 1] → posterior
    moments ``(B, T', H/32, W/32, 2z)``. Frame 0 alone (``caches=None``), then chunks of
    ``temporal_scale`` frames with the returned caches (one latent frame each)."""

    steps_with_caches = True
    needs_clip_frames = False
    lookahead = None

    def __init__(self, config, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.temporal_scale = config.temporal_scale
        wrapped = config.decoder_plan().conv_shortcut_wrapped
        self.encoder = Encoder3d(config.encoder_plan(), config.resnet_norm_eps, wrapped, rngs=rngs, dtype=dtype)

    @scoped
    def __call__(self, x: jax.Array, caches, ctx: SpatialContext, *, clip_frames: int | None = None):
        del clip_frames
        if caches is None and x.shape[1] != 1:
            raise ValueError(f"the first encode step takes exactly 1 frame; got {x.shape[1]}")
        if caches is not None and x.shape[1] % self.temporal_scale:
            raise ValueError(f"later encode steps take multiples of {self.temporal_scale} frames; got {x.shape[1]}")
        with jax.named_scope("encoder"):
            return self.encoder(x, caches, ctx, Step(caches is None, 0))


def check_encoder_config(config: LTXVideoConfig | LTX2VideoConfig) -> None:
    """Raise ``ConfigError`` for a config whose decoder runs but whose encoder does not."""
    problems = config.encoder_problems()
    if problems:
        raise ConfigError(f"this {config.class_name} config's encoder cannot run: " + "; ".join(problems))
