"""Probes (GET and HEAD) and metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..deps import StateDep
from ..schemas import Health, Ready

router = APIRouter(tags=["operations"])


# HEAD answers as GET does, without the body (the server drops it): load balancers and uptime
# checks probe with it. Kept out of the OpenAPI document, which would list each probe twice.
@router.head("/healthz", include_in_schema=False)
@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
async def healthz(state: StateDep) -> Response:
    # Liveness: the process serves HTTP. A failed model load (or multi-host slice) also fails
    # liveness, saying why, so that an orchestrator restarts the container instead of keeping a
    # server that can never be ready.
    if state.phase == "failed":
        return JSONResponse(Health(status="failed", detail=state.error).model_dump(exclude_none=True), status_code=503)
    return JSONResponse(Health(status="ok").model_dump(exclude_none=True))


@router.head("/readyz", include_in_schema=False)
@router.get("/readyz", response_model=Ready, responses={503: {"model": Ready}})
async def readyz(state: StateDep) -> Response:
    ready = state.phase == "ready"
    body = Ready(status=state.phase, ready=ready, detail=state.error)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
                             "description": "Prometheus text format"}})
async def metrics(state: StateDep) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
