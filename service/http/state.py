"""The service's state: one object, built by ``create_app``, kept on ``app.state.service``.

Only the event loop writes it. The device thread reports start-up results through the callbacks
the lifespan gives it, which hop onto the loop (``call_soon_threadsafe``); route handlers read it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..engine.errors import Unavailable
from ..engine.model import ModelState
from ..engine.worker import Worker
from ..metrics import Metrics
from ..settings import Settings
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

    # -- transitions (event loop only) -----------------------------------------------------------
    def set_ready(self, model: ModelState) -> None:
        self.model = model
        if model.memory is not None:
            self.host.limit = model.memory.host_bytes
            self.metrics.host_memory_limit.set(model.memory.host_bytes)
        if self.phase == "loading":
            self.phase = "ready"

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
