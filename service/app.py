"""The FastAPI app factory: ``create_app(settings, vae=None)``.

The lifespan starts the device worker, which loads the model (or takes the one given, for tests
and embedders), builds the mesh and compiles the warm-up shapes in its own thread, so /healthz
answers at once and /readyz turns 200 only when decoding will not stall on a compile.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

import anyio
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import MutableHeaders

from . import codec, responses
from .deps import ApiKeyDep, BodyKindDep, DecodeParamsDep, MetricsDep, SettingsDep, WorkerDep, read_body
from .errors import Problem, install_error_handlers
from .metrics import Metrics
from .protocol import DecodeParams, Health, MeshInfo, ModelInfo, ModelList, Ready
from .protocol import Problem as ProblemModel
from .runner import DeviceRunner
from .settings import Settings
from .worker import Job, Worker

log = logging.getLogger("vaeserve")

_ROUTES = ("/v1/decode", "/v1/models", "/healthz", "/readyz", "/metrics")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class RequestContext:
    """ASGI middleware: a request id on every request and response, and the requests counter.

    Pure ASGI rather than BaseHTTPMiddleware so streaming bodies and disconnects pass through."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                if "x-request-id" not in headers:
                    headers.append("X-Request-Id", request_id)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = scope["path"] if scope["path"] in _ROUTES else "other"
            self.metrics.requests.labels(route, str(status)).inc()


def _configure_jax(settings: Settings) -> None:
    import jax

    if settings.cpu_devices:
        jax.config.update("jax_num_cpu_devices", settings.cpu_devices)
    if settings.compile_cache:
        jax.config.update("jax_compilation_cache_dir", settings.compile_cache)
        # Cache every program: a decode compile is expensive even when XLA thinks it is quick.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _loader(app: FastAPI, settings: Settings, metrics: Metrics, vae):
    def load() -> tuple[DeviceRunner, dict[str, Any]]:
        import jax

        import models
        import sharding

        model = vae
        if model is None:
            if settings.model is None:
                log.warning("no --model given: loading the embedded default (Wan 2.1 architecture)")
            model = models.load_vae(settings.model, dtype=settings.dtype)
        if model.metadata.get("random_weights"):
            log.warning("the model has RANDOM weights: outputs are noise-like, for testing only")
        mesh = sharding.make_mesh(settings.tp, settings.dp)
        runner = DeviceRunner(model, mesh, max_batch=settings.max_batch, dp=settings.dp,
                              on_compile=lambda key: metrics.compiles.inc())
        config = model.config
        shape = (1, config.z_dim, 1, 1, 1)
        app.state.norm = (np.asarray(config.latents_mean, np.float32).reshape(shape),
                          np.asarray(config.latents_std, np.float32).reshape(shape))
        app.state.limits = codec.Limits(
            channels=config.z_dim, max_batch=settings.max_batch, max_frames=settings.max_frames,
            max_height=settings.max_height, max_width=settings.max_width,
            temporal_scale=config.temporal_scale, spatial_scale=config.spatial_scale)
        app.state.vae = model
        info = {"devices": [str(d) for d in np.asarray(mesh.devices).ravel()],
                "platform": jax.default_backend()}
        return runner, info
    return load


def _warmer(app: FastAPI, settings: Settings):
    def warmup(runner: DeviceRunner) -> None:
        for shape in settings.warmup:
            for size in runner.buckets:
                start = time.monotonic()
                runner.decode(np.zeros((size, *shape), np.float32), output="uint8")
                log.info("warm-up %s x %s compiled in %.1f s", size, shape, time.monotonic() - start)
        app.state.warmed = [list(s) for s in settings.warmup]
    return warmup


def create_app(settings: Settings | None = None, vae=None) -> FastAPI:
    """Build the app. ``vae`` (a ``models`` VAE) skips loading; otherwise ``settings.model``."""
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        _configure_jax(settings)
        worker = Worker(load=_loader(app, settings, metrics, vae), warmup=_warmer(app, settings),
                        metrics=metrics, max_queue=settings.max_queue, max_batch=settings.max_batch,
                        retry_after_s=settings.retry_after_s)
        app.state.worker = worker
        worker.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(worker.stop, settings.drain_timeout_s)

    app = FastAPI(title="vaeserve", version="0.1.0", lifespan=lifespan,
                  description="Latents in, MP4 / frames / tensors out (Wan 2.1 VAE on JAX).")
    app.state.settings, app.state.metrics, app.state.draining, app.state.warmed = settings, metrics, False, []
    install_error_handlers(app)
    _add_routes(app)
    app.add_middleware(RequestContext, metrics=metrics)
    return app


def _job_kind(params: DecodeParams) -> str:
    if params.stream:
        return "stream"
    return "float" if params.output_type == "pt" and not params.partial_postprocess else "uint8"


def _prepare(app: FastAPI, body: bytes, kind: str, params: DecodeParams) -> tuple[np.ndarray, bool]:
    """Parse, validate, scale and denormalize on the host (in a thread: it touches every value)."""
    limits: codec.Limits = app.state.limits
    latents, batched = codec.parse_latents(body, kind, params.shape, params.dtype, limits)
    latents = codec.apply_scaling(latents, params.scaling_factor, params.shift_factor)
    if params.denormalize:
        mean, std = app.state.norm
        latents = latents * std + mean
    frames = limits.output_frames(latents.shape[2])
    if params.output_type in ("mp4", "png") and not params.stream and latents.shape[0] != 1:
        raise Problem(422, "batch-not-supported", f"{params.output_type} holds one video",
                      expected="batch size 1", received=latents.shape[0])
    if params.output_type == "png" and params.frame >= frames:
        raise Problem(422, "invalid-frame", f"frame {params.frame} does not exist",
                      expected=f"frame < {frames}", received=params.frame)
    return np.ascontiguousarray(latents, np.float32), batched


def _add_routes(app: FastAPI) -> None:
    @app.get("/healthz", response_model=Health, tags=["operations"])
    async def healthz(worker: WorkerDep):
        # Liveness: the process serves HTTP. A failed model load also fails liveness so that an
        # orchestrator restarts the container instead of keeping a server that can never be ready.
        if worker.state == "failed":
            return JSONResponse({"status": "failed"}, status_code=503)
        return Health(status="ok")

    @app.get("/readyz", response_model=Ready, tags=["operations"])
    async def readyz(request: Request, worker: WorkerDep):
        ready = worker.state == "ready" and not request.app.state.draining
        status = "draining" if request.app.state.draining else worker.state
        body = Ready(status=status, ready=ready, detail=worker.error)
        return JSONResponse(body.model_dump(), status_code=200 if ready else 503)

    @app.get("/metrics", tags=["operations"])
    async def metrics_endpoint(metrics: MetricsDep):
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=ModelList, dependencies=[ApiKeyDep], tags=["decode"])
    async def list_models(request: Request, settings: SettingsDep, worker: WorkerDep):
        if worker.runner is None:
            raise Problem(503, "unavailable", f"service is {worker.state}", headers={"Retry-After": "1"})
        vae = request.app.state.vae
        meta = dict(vae.metadata)
        return ModelList(data=[ModelInfo(
            id=settings.model or "wan2.1-vae-default", source=meta.get("source"),
            random_weights=meta.get("random_weights"), dtype=vae.dtype, config=vae.config.to_dict(),
            metadata=meta, mesh=MeshInfo(dp=settings.dp, tp=settings.tp, devices=worker.info["devices"]),
            batch_buckets=worker.runner.buckets, warmed_shapes=request.app.state.warmed,
            compiled=worker.runner.compiled_shapes)])

    problem = {"model": ProblemModel, "content": {"application/problem+json": {}}}
    decode_responses = {
        200: {"content": {"video/mp4": {}, "application/x-npy": {}, "image/png": {},
                          "application/octet-stream": {}, responses.STREAM_MEDIA_TYPE: {}}},
        **{code: problem for code in (401, 413, 415, 422, 429, 500, 503, 504)},
    }

    @app.post("/v1/decode", dependencies=[ApiKeyDep], tags=["decode"], responses=decode_responses)
    async def decode(request: Request, params: DecodeParamsDep, kind: BodyKindDep, settings: SettingsDep,
                     worker: WorkerDep, metrics: MetricsDep):
        """Decode latents ``(B, 16, T, H, W)`` or ``(16, T, H, W)``; see the README for formats."""
        arrived = time.monotonic()
        if worker.state != "ready" or request.app.state.draining:
            state = "draining" if request.app.state.draining else worker.state
            raise Problem(503, "unavailable", f"service is {state}",
                          headers={"Retry-After": str(settings.retry_after_s)})
        body = await read_body(request, settings.max_body_bytes)
        latents, batched = await anyio.to_thread.run_sync(_prepare, request.app, body, kind, params)
        fault = settings.fault_injection and request.headers.get("x-vaeserve-fault") == "device"
        job = Job(request.state.request_id, latents, _job_kind(params), deadline=arrived + params.timeout_s,
                  loop=asyncio.get_running_loop(), arrived=arrived, fault=fault)
        worker.submit(job)
        try:
            if params.stream:
                return await responses.stream(request, job, batched)
            result = await responses.wait_for(request, job, job.future)
        except responses.ClientGone:
            return Response(status_code=responses.CLIENT_GONE)
        response = await responses.render(result, params, batched, metrics)
        metrics.total_seconds.observe(time.monotonic() - arrived)
        return response
