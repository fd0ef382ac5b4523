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
from ..engine.model import ModelState
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
    host: MemoryBudget  # the host account: what requests hold on the host (sized from the model's memory plan)
    worker: Worker | None = None  # set by the lifespan
    mp4_pool: Mp4Pool | None = None  # set by the lifespan (its FIFO belongs to the serving loop)
    phase: Phase = "loading"
    model: ModelState | None = None
    error: str | None = None
    refused: bool = False  # start-up refused to serve as configured: the process exits non-zero
    stop_server: Callable[[], None] | None = None  # set by the server that runs the app (service.http.server)
    _drain: asyncio.Future[None] | None = field(default=None, repr=False)  # begun once (drain())

    # -- transitions (event loop only) -----------------------------------------------------------
    def set_ready(self, model: ModelState) -> None:
        self.model = model
        if model.memory is not None:
            self.host.limit = model.memory.host_bytes
            self.metrics.host_memory_limit.set(model.memory.host_bytes)
        if self.phase == "loading":
            self.phase = "ready"
            log.info("%s", ready_line(model, self.settings))

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
        if self.model is not None and self.model.follower:
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
        if worker.model is not None and worker.model.follower:  # its device loop ends with process 0's STOP
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
    def serving(self) -> tuple[ModelState, Worker]:
        """The model and worker; ``Unavailable`` while loading, draining or failed, and on the
        followers of a multi-host slice (process 0 serves requests)."""
        if self.phase != "ready" or self.model is None or self.worker is None:
            raise Unavailable(self.error if self.phase == "failed" and self.error else f"service is {self.phase}")
        cluster = self.model.cluster
        if cluster is not None and not cluster.is_leader:
            raise Unavailable(f"this is process {cluster.process_id} of a {cluster.num_processes}-process slice: "
                              "it follows process 0, which serves requests")
        return self.model, self.worker


def ready_line(model: ModelState, settings: Settings) -> str:
    """The one log line that says the service is ready: where, which model, on what, and what
    was compiled ahead (a request of another shape compiles first)."""
    meta = model.vae.metadata
    name = settings.model or meta.get("name", "vae")
    weights = " with RANDOM weights" if meta.get("random_weights") else ""
    devices = f"{len(model.devices)} {model.platform} device{'s' if len(model.devices) != 1 else ''}"
    warmed = ", ".join(str(w) for w in model.warmed) or "none (each new shape compiles on its first request)"
    if model.follower:
        assert model.cluster is not None
        return (f"ready: process {model.cluster.process_id} of the slice, following process 0 ({name}{weights}, "
                f"{devices})")
    return (f"ready on http://{settings.host}:{settings.port}: {name}{weights}, {model.vae.dtype}, {devices} "
            f"(dp={settings.dp}, tp={settings.tp}); warmed: {warmed}")
