"""The FastAPI app factory: ``create_app(settings=None, *, vae=None, runner_factory=None)``.

The lifespan starts the device worker, which loads the model (or takes the one given, for tests
and embedders), builds the mesh and runner, and compiles the warm-up shapes in its own thread
(:mod:`service.loading`); on shutdown it drains: no new work, queued work finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
from fastapi import FastAPI

from .admission import ByteBudget
from .errors import install_error_handlers
from .loading import RunnerFactory, StartupRefused, startup
from .metrics import Metrics
from .middleware import RequestContext
from .routes import decode, encode, operations
from .settings import Settings
from .slice import FOLLOWER_STOP_MARGIN_S
from .state import ModelState, ServiceState
from .worker import Worker


def _start_worker(state: ServiceState, startup_fn: Callable[[], ModelState]) -> Worker:
    loop = asyncio.get_running_loop()
    settings = state.settings
    def on_ready(model: ModelState) -> None:  # called in the worker thread: hop onto the loop
        loop.call_soon_threadsafe(state.set_ready, model)

    def on_failed(error: str) -> None:
        loop.call_soon_threadsafe(state.set_failed, error)

    def startup_or_refuse() -> ModelState:
        try:
            return startup_fn()
        except StartupRefused as refusal:  # the serving process exits (server.serve)
            loop.call_soon_threadsafe(state.set_refused, f"start-up refused: {refusal}")
            raise

    worker = Worker(startup=startup_or_refuse, metrics=state.metrics, max_queue=settings.max_queue,
                    max_batch=settings.max_batch, retry_after_s=settings.retry_after_s, on_ready=on_ready,
                    on_failed=on_failed)
    state.worker = worker
    worker.start()
    return worker


async def _stop(worker: Worker, settings: Settings) -> None:
    """Drain the worker; on a multi-host slice, then leave it (process 0 stops the followers).
    A follower's device thread ends when process 0's STOP arrives: it waits for that longer."""
    model = worker.model
    timeout = settings.drain_timeout_s
    if model is not None and model.follower:
        timeout += FOLLOWER_STOP_MARGIN_S
    await anyio.to_thread.run_sync(worker.stop, timeout)
    if model is not None and model.slice is not None:
        await anyio.to_thread.run_sync(model.slice.leave, not worker.alive)


def create_app(settings: Settings | None = None, *, vae: Any = None,
               runner_factory: RunnerFactory | None = None) -> FastAPI:
    """Build the app. ``vae`` (a ``models`` VAE) skips loading ``settings.model``;
    ``runner_factory(vae, mesh, max_batch=, dp=)`` replaces :class:`service.runner.DeviceRunner`."""
    settings = settings or Settings()
    state = ServiceState(settings=settings, metrics=Metrics(), reading=ByteBudget(settings.max_reading_bytes))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        def on_slice_failure(reason: str) -> None:  # a monitor or device thread: hop onto the loop
            loop.call_soon_threadsafe(state.fail_slice, reason)

        worker = _start_worker(state, partial(startup, settings, state.metrics, vae=vae, runner_factory=runner_factory,
                                              on_slice_failure=on_slice_failure))
        try:
            yield
        finally:
            state.set_draining()  # whoever embeds the app: readyz 503, new work 503, queued work finishes
            await _stop(worker, settings)

    app = FastAPI(title="vaeserve", version="0.1.0", lifespan=lifespan,
                  description="Latents in, MP4 / frames / tensors out; images / video / frames in, latents "
                  "out (Wan 2.1 VAE on JAX).")
    app.state.service = state
    install_error_handlers(app)
    app.include_router(operations.router)
    app.include_router(decode.router)
    app.include_router(encode.router)
    app.add_middleware(RequestContext, metrics=state.metrics)
    return app
