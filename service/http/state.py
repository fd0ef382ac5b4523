"""The service's state: one object, built by ``create_app``, kept on ``app.state.service``.

Only the event loop writes it. The device thread reports start-up results through the callbacks
the lifespan gives it, which hop onto the loop (``call_soon_threadsafe``); route handlers read it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import anyio

from ..engine.errors import Unavailable
from ..engine.model import ModelState, ServedModels
from ..engine.worker import Worker
from ..metrics import Metrics
from ..settings import Settings
from ..slice.boot import FOLLOWER_STOP_MARGIN_S
from .admission import ByteBudget, MemoryBudget
from .mp4_pool import Mp4Pool

log = logging.getLogger("vaeserve")

Phase = Literal["loading", "ready", "draining", "failed"]


@dataclass
class ServiceState:
    settings: Settings
    metrics: Metrics
    reading: ByteBudget  # request bodies being read
    host: MemoryBudget  # the host account: what requests hold on the host, for every model (sized from the memory plan)
    worker: Worker | None = None  # set by the lifespan
    mp4_pool: Mp4Pool | None = None  # set by the lifespan (its FIFO belongs to the serving loop)
    phase: Phase = "loading"
    models: ServedModels | None = None
    error: str | None = None
    refused: bool = False  # start-up refused to serve as configured: the process exits non-zero
    stop_server: Callable[[], None] | None = None  # set by the server that runs the app (service.http.server)
    _drain: asyncio.Future[None] | None = field(default=None, repr=False)  # begun once (drain())

    # -- transitions (event loop only) -----------------------------------------------------------
    def set_ready(self, models: ServedModels) -> None:
        self.models = models
        self.host.limit = models.memory.host_bytes  # one host account for every model
        self.metrics.host_memory_limit.set(models.memory.host_bytes)
        if self.phase == "loading":
            self.phase = "ready"
            log.info("%s", ready_line(models, self.settings))

    def set_failed(self, error: str) -> None:
        if not self.refused:  # the refusal's message is the one to keep
            self.phase, self.error = "failed", error

    def set_refused(self, error: str) -> None:
        """Start-up found the configuration cannot work (``StartupRefused``): fail, then exit."""
        self.set_failed(error)
        self.refused = True

    def set_draining(self) -> None:
        if self.phase != "failed":
            self.phase = "draining"

    def drain(self) -> asyncio.Future[None]:
        """The drain, begun at the first call (event loop): readyz and new work 503 at once; the
        worker finishes what is queued and running up to ``drain_timeout_s``, then answers what is
        left 503 ``unavailable`` (a stream in-band) and stops. The server begins it when the signal
        lands, beside its own shutdown (``service.http.server``); the lifespan's shutdown awaits it
        (an embedded app's drain begins there)."""
        if self._drain is None:
            self.set_draining()
            self._drain = asyncio.ensure_future(self._stop_worker())
        return self._drain

    def end_drain(self, reason: str) -> None:
        """End the drain now (event loop; a second signal): begun if it was not, and what it still
        waits for is answered 503 at once, as at ``drain_timeout_s``. Not on a follower of a
        multi-host slice, whose drain is waiting for process 0 to stop the slice: leaving before
        would fail the slice under process 0's requests."""
        if self.models is not None and self.models.follower:
            log.warning("%s: ignored; a follower leaves when process 0 stops the slice", reason)
            return
        log.warning("%s: the drain ends now; what is left is answered 503", reason)
        self.drain()
        if self.worker is not None:
            self.worker.end_drain()

    async def _stop_worker(self) -> None:
        worker = self.worker
        if worker is None:
            return
        timeout = self.settings.drain_timeout_s
        if worker.models is not None and worker.models.follower:  # its device loop ends with process 0's STOP
            timeout += FOLLOWER_STOP_MARGIN_S
        await anyio.to_thread.run_sync(worker.stop, timeout)

    def fail_slice(self, reason: str) -> None:
        """The multi-host slice failed: unhealthy with the reason, and every request waiting or in
        flight answered 503 now (the process exits after ``failure_grace_s``)."""
        self.set_failed(f"the multi-host slice failed: {reason}")
        if self.worker is not None:
            self.worker.abort(Unavailable(self.error or reason))

    def request_stop(self, reason: str) -> None:
        """Stop serving as a SIGTERM would (drain, then shut down): asked by the slice."""
        log.warning("stopping: %s", reason)
        self.set_draining()
        if self.stop_server is not None:
            self.stop_server()
        else:  # an app embedded in someone else's server: only that server can stop it
            log.error("no server to stop (the app is embedded): stop it from outside")

    # -- reads -------------------------------------------------------------------------------------
    def serving_all(self) -> tuple[ServedModels, Worker]:
        """The models and worker; ``Unavailable`` while loading, draining or failed, and on the
        followers of a multi-host slice (process 0 serves requests)."""
        if self.phase != "ready" or self.models is None or self.worker is None:
            raise Unavailable(self.error if self.phase == "failed" and self.error else f"service is {self.phase}")
        cluster = self.models.cluster
        if cluster is not None and not cluster.is_leader:
            raise Unavailable(f"this is process {cluster.process_id} of a {cluster.num_processes}-process slice: "
                              "it follows process 0, which serves requests")
        return self.models, self.worker

    def serving(self, name: str | None = None) -> tuple[ModelState, Worker]:
        """The model a request names (``name``; None: the only one served) and the worker:
        ``Unavailable`` as ``serving_all`` says, then ``ModelNotServed`` or ``ModelNotNamed``."""
        models, worker = self.serving_all()
        return models.choose(name), worker


def ready_line(models: ServedModels, settings: Settings) -> str:
    """The one log line that says the service is ready: where, which models, on what, and what
    was compiled ahead (a request of another shape compiles first)."""
    model = models.first
    names = ", ".join(f"{name}{' with RANDOM weights' if each.vae.metadata.get('random_weights') else ''}"
                      for name, each in models.by_name.items())
    devices = f"{len(model.devices)} {model.platform} device{'s' if len(model.devices) != 1 else ''}"
    warmed = ", ".join(str(w) for each in models.by_name.values() for w in each.warmed) or (
        "none (each new shape compiles on its first request)")
    if model.follower:
        assert model.cluster is not None
        return f"ready: process {model.cluster.process_id} of the slice, following process 0 ({names}, {devices})"
    return (f"ready on http://{settings.host}:{settings.port}: {names}, {model.vae.dtype}, {devices} "
            f"(dp={settings.dp}, tp={settings.tp}); warmed: {warmed}")
