"""``GET /v1/models``: every model served, its latents' rules and limits, the mesh and the programs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from vaeserve.models.conditions import SEED_RANGE, TIMESTEP_RANGE, condition_defaults

from ...engine.model import ModelState
from ...settings import Settings
from ..deps import ApiKeyDep, StateDep
from ..query import StrictQueryDep
from ..schemas import (
    PROBLEM_RESPONSES,
    ConditionsInfo,
    LatentsInfo,
    MemoryInfo,
    MeshInfo,
    ModelInfo,
    ModelList,
    ProgramMemory,
    SoundDescription,
    VideoSize,
    WarmedShape,
)

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList, dependencies=[ApiKeyDep, StrictQueryDep],
            responses={code: PROBLEM_RESPONSES[code] for code in (401, 422, 503)})
async def list_models(state: StateDep) -> ModelList:
    models, _ = state.serving_all()
    return ModelList(data=[model_info(model, state.settings) for model in models.by_name.values()])


def model_info(model: ModelState, settings: Settings) -> ModelInfo:
    """One served model: its id (what a request names it by), weights, latents' rules and limits,
    its mesh, programs and memory."""
    vae = model.vae
    meta, limits = dict(vae.metadata), model.limits
    config = vae.config
    images = config.is_image
    latents = LatentsInfo(
        is_image=images, layout="(B, C, H, W)" if images else "(B, C, T, H, W)", channels=limits.channels,
        spatial_scale=limits.spatial_scale, temporal_scale=None if images else limits.temporal_scale,
        latents_mean=list(config.latents_mean), latents_std=list(config.latents_std), causal=config.causal,
        framewise=model.framewise,
        max_batch=limits.max_batch, max_latent_frames=None if images else limits.max_latent_frames,
        max_latent_height=limits.max_latent_height, max_latent_width=limits.max_latent_width,
        max_height=limits.max_height, max_width=limits.max_width)
    return ModelInfo(
        id=model.name, source=meta.get("source"),
        random_weights=meta.get("random_weights"), dtype=vae.dtype, encodes=vae.has_encoder, latents=latents,
        decode_conditions=conditions_info(vae), config=vae.config.to_dict(),
        metadata=meta, mesh=MeshInfo(dp=settings.dp, tp=settings.tp, devices=model.devices,
                                     processes=model.cluster.num_processes if model.cluster else 1,
                                     convs=model.convs),
        batch_buckets=model.runner.buckets, warmed_shapes=[list(w.shape) for w in model.warmed],
        warmed=[WarmedShape(shape=list(w.shape), outputs=list(w.outputs_for(images=config.is_image)))
                for w in model.warmed],
        compiled=model.runner.programs(),
        program_memory=[ProgramMemory(**row) for row in model.runner.program_memory()],
        device_memory_bytes=model.device_memory_bytes, memory=memory_info(model),
        sound=None if model.sound is None else SoundDescription(**model.sound.describe()))


def conditions_info(vae: Any) -> ConditionsInfo | None:
    """The conditions a decode of ``vae`` takes and their defaults (``models.decode.condition_defaults``)."""
    config = vae.config
    if not config.decode_conditions:
        return None
    conditioned = bool(getattr(config, "timestep_conditioning", False))
    timestep, noise_scale = condition_defaults(vae.metadata)
    return ConditionsInfo(timestep_conditioned=conditioned, injects_noise=bool(getattr(config, "injects_noise", False)),
                          default_timestep=timestep if conditioned else None,
                          default_noise_scale=noise_scale if conditioned else None,
                          timestep_range=list(TIMESTEP_RANGE), seed_range=[0, SEED_RANGE])


def memory_info(model: ModelState) -> MemoryInfo | None:
    plan, guard = model.memory, model.guard
    if plan is None:
        return None

    def sizes(videos: list) -> list[VideoSize]:
        return [VideoSize(width=v.width, height=v.height, frames=v.frames, bytes=v.bytes) for v in videos]

    machine = plan.machine
    return MemoryInfo(
        device_bytes=plan.device_bytes, device_source=plan.device_source, host_bytes=plan.host_bytes,
        machine_bytes=machine.bytes if machine else None, machine_source=machine.source if machine else None,
        reserve_bytes=plan.reserve_bytes,
        largest_decode=sizes(guard.largest_decode()) if guard else [],
        largest_encode=sizes(guard.largest_encode()) if guard and model.vae.has_encoder else [])
