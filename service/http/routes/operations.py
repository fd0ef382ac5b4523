"""Probes, metrics and the model list."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..deps import ApiKeyDep, StateDep
from ..schemas import (
    PROBLEM_RESPONSES,
    Health,
    LatentsInfo,
    MeshInfo,
    ModelInfo,
    ModelList,
    ProgramMemory,
    Ready,
    WarmedShape,
)

router = APIRouter()


@router.get("/healthz", response_model=Health, tags=["operations"], responses={503: {"model": Health}})
async def healthz(state: StateDep) -> Response:
    # Liveness: the process serves HTTP. A failed model load (or multi-host slice) also fails
    # liveness, saying why, so that an orchestrator restarts the container instead of keeping a
    # server that can never be ready.
    if state.phase == "failed":
        return JSONResponse(Health(status="failed", detail=state.error).model_dump(exclude_none=True), status_code=503)
    return JSONResponse(Health(status="ok").model_dump(exclude_none=True))


@router.get("/readyz", response_model=Ready, tags=["operations"], responses={503: {"model": Ready}})
async def readyz(state: StateDep) -> Response:
    ready = state.phase == "ready"
    body = Ready(status=state.phase, ready=ready, detail=state.error)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get("/metrics", tags=["operations"], response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
                             "description": "Prometheus text format"}})
async def metrics(state: StateDep) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", response_model=ModelList, dependencies=[ApiKeyDep], tags=["decode"],
            responses={code: PROBLEM_RESPONSES[code] for code in (401, 422, 503)})
async def list_models(state: StateDep) -> ModelList:
    model, _ = state.serving()
    settings, vae = state.settings, model.vae
    meta, limits = dict(vae.metadata), model.limits
    config = vae.config
    latents = LatentsInfo(
        channels=limits.channels, spatial_scale=limits.spatial_scale, temporal_scale=limits.temporal_scale,
        latents_mean=list(config.latents_mean), latents_std=list(config.latents_std), causal=config.causal,
        framewise=model.framewise,
        max_batch=limits.max_batch, max_latent_frames=limits.max_latent_frames,
        max_latent_height=limits.max_latent_height, max_latent_width=limits.max_latent_width)
    return ModelList(data=[ModelInfo(
        id=settings.model or meta.get("name", "vae"), source=meta.get("source"),
        random_weights=meta.get("random_weights"), dtype=vae.dtype, encodes=vae.has_encoder, latents=latents,
        config=vae.config.to_dict(),
        metadata=meta, mesh=MeshInfo(dp=settings.dp, tp=settings.tp, devices=model.devices,
                                     processes=model.cluster.num_processes if model.cluster else 1),
        batch_buckets=model.runner.buckets, warmed_shapes=[list(w.shape) for w in model.warmed],
        warmed=[WarmedShape(shape=list(w.shape), outputs=list(w.outputs)) for w in model.warmed],
        compiled=model.runner.programs(),
        program_memory=[ProgramMemory(**row) for row in model.runner.program_memory()],
        device_memory_bytes=model.device_memory_bytes)])
