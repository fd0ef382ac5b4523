"""The FastAPI app factory: ``create_app(settings=None, *, vae=None, runner_factory=None)``.

The lifespan starts the device worker, which loads the model (or takes the one given, for tests
and embedders), builds the mesh and runner, and compiles the warm-up shapes in its own thread
(``service.engine.boot``); on shutdown it drains: no new work, queued work finished. On a
multi-host slice it joins the slice first and leaves it last (``service.slice.boot``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
from fastapi import FastAPI

from ..engine.boot import boot
from ..engine.errors import StartupRefused
from ..engine.model import RunnerFactory, ServedModels
from ..engine.worker import Worker
from ..metrics import Metrics
from ..settings import Settings
from ..slice.boot import slice_joiner
from ..slice.control import SliceHooks
from .admission import ByteBudget, MemoryBudget
from .middleware import RequestContext
from .mp4_pool import Mp4Pool
from .problems import install_error_handlers
from .routes import decode, docs, encode, models, operations, ui
from .state import ServiceState

VERSION = "0.2.0"


def _start_worker(state: ServiceState, startup: Callable[[], ServedModels]) -> Worker:
    loop = asyncio.get_running_loop()

    def on_ready(models: ServedModels) -> None:  # called in the device thread: hop onto the loop
        loop.call_soon_threadsafe(state.set_ready, models)

    def on_failed(error: str) -> None:
        loop.call_soon_threadsafe(state.set_failed, error)

    def startup_or_refuse() -> ServedModels:
        try:
            return startup()
        except StartupRefused as refusal:  # the serving process exits 3 (service.http.server)
            loop.call_soon_threadsafe(state.set_refused, f"start-up refused: {refusal}")
            raise

    settings = state.settings
    worker = Worker(startup=startup_or_refuse, metrics=state.metrics, max_queue=settings.max_queue,
                    max_batch=settings.max_batch, on_ready=on_ready, on_failed=on_failed,
                    stream_buffer_bytes=settings.stream_buffer_bytes, slow_reader_s=settings.slow_reader_s)
    state.worker = worker
    state.metrics.buffered_bytes.set_function(worker.buffered_bytes)
    state.metrics.queue_depth.set_function(worker.waiting)
    state.metrics.uploads.set_function(worker.uploading)
    worker.start()
    return worker


async def _leave_slice(worker: Worker) -> None:
    """After the drain, on a multi-host slice: leave it (process 0 stops the followers)."""
    models = worker.models
    if models is not None and models.cluster is not None:
        await anyio.to_thread.run_sync(models.cluster.leave, not worker.alive)


def create_app(settings: Settings | None = None, *, vae: Any = None,
               runner_factory: RunnerFactory | None = None) -> FastAPI:
    """Build the app. ``vae`` (a ``models`` VAE, or a dict of them by name) skips loading ``settings.model``;
    ``runner_factory(vae, mesh, max_batch=, dp=)`` replaces ``service.engine.runner.DeviceRunner``."""
    settings = settings or Settings()
    metrics = Metrics()
    # The host account's size comes with the model (its memory plan, once the device side knows the
    # platform); nothing is admitted before.
    state = ServiceState(settings=settings, metrics=metrics, reading=ByteBudget(settings.max_reading_bytes),
                         host=MemoryBudget(settings.host_memory_bytes or 0, metrics.host_memory_bytes.set))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        join = None
        if settings.multi_process:  # the slice's threads report through the loop
            def on_loop(method: Callable[[str], None]) -> Callable[[str], None]:
                def call(reason: str) -> None:
                    loop.call_soon_threadsafe(method, reason)
                return call

            hooks = SliceHooks(on_failure=on_loop(state.fail_slice), stop_server=on_loop(state.request_stop))
            join = slice_joiner(settings, hooks)
        state.mp4_pool = Mp4Pool(settings.mp4_writer_count, state.metrics)
        worker = _start_worker(state, partial(boot, settings, state.metrics, vae=vae, runner_factory=runner_factory,
                                              join=join))
        try:
            yield
        finally:
            await state.drain()  # begun already at SIGTERM under vaeserve serve; here under another ASGI server
            await _leave_slice(worker)
            state.mp4_pool.shutdown()

    app = FastAPI(title="vaeserve", version=VERSION, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Latents in, MP4 / frames / tensors out; images / video / frames in, latents "
                  "out: video VAEs (Wan 2.1 and 2.2, HunyuanVideo 1.0 and 1.5) on JAX, exact when sharded over devices.")
    app.state.service = state
    install_error_handlers(app)
    app.include_router(operations.router)
    app.include_router(models.router)
    app.include_router(decode.router)
    app.include_router(encode.router)
    app.include_router(ui.router)
    app.include_router(docs.router)  # FastAPI's own pages load their scripts from a CDN
    app.mount(docs.ASSETS_PATH, docs.assets())
    app.add_middleware(RequestContext, metrics=state.metrics)
    return app
