"""The service's state: one object, built by ``create_app``, kept on ``app.state.service``.

Only the event loop writes it. The worker thread reports start-up results through the callbacks
the lifespan gives it, which hop onto the loop (``call_soon_threadsafe``); route handlers read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .codec import Limits
from .errors import Problem
from .metrics import Metrics
from .settings import FrameShape, Settings, Warmup

if TYPE_CHECKING:
    from .admission import ByteBudget
    from .runner import DeviceRunner
    from .slice import SliceMember
    from .worker import Worker

Phase = Literal["loading", "ready", "draining", "failed"]
# Strict shapes: latent (C, T, H, W) -> the outputs served for it ("uint8", "float", "stream").
ServedShapes = dict[tuple[int, ...], frozenset[str]]


@dataclass(frozen=True)
class ModelState:
    """What start-up produced; read-only afterwards (built by ``service.loading.load_model``)."""

    vae: Any
    runner: DeviceRunner
    limits: Limits
    mean: np.ndarray  # (1, C, 1, 1, 1) float32: latents_mean
    std: np.ndarray  # (1, C, 1, 1, 1) float32: latents_std
    devices: list[str]
    platform: str
    warmed: tuple[Warmup, ...]
    served: ServedShapes | None  # None: any shape (programs compiled on demand, LRU-bounded)
    device_memory_bytes: int | None = None  # per-device memory warm-up programs must fit (None: no check)
    encode_served: frozenset[FrameShape] | None = None  # frames (3, F, H, W) encoded; None: any
    slice: SliceMember | None = None  # this process's part in a multi-host slice (service.slice)

    @property
    def follower(self) -> bool:
        """A process of a multi-host slice other than process 0: it serves probes, not requests."""
        return self.slice is not None and not self.slice.is_leader

    def check_served(self, shape: tuple[int, ...], output: str) -> None:
        """422 unless latents of ``shape`` (C, T, H, W) are served with ``output`` (``--shapes``)."""
        if self.served is None or output in self.served.get(shape, ()):
            return
        allowed = sorted(f"{'x'.join(map(str, s))}:{','.join(sorted(o))}" for s, o in self.served.items())
        raise Problem(422, "shape-not-allowed", f"latents {'x'.join(map(str, shape))} with output {output} are not "
                      "served here (--shapes)", expected=allowed, received=f"{'x'.join(map(str, shape))}:{output}")

    def require_encoder(self) -> None:
        """501 unless the checkpoint has an encoder (answered before the body is read)."""
        if not self.vae.has_encoder:
            raise Problem(501, "no-encoder", "the served checkpoint has no encoder weights (encoder.*, quant_conv.*): "
                          "it decodes but cannot encode", expected="a full VAE checkpoint", received="decoder only")

    def check_encode_served(self, shape: tuple[int, ...]) -> None:
        """422 unless frames of ``shape`` (3, F, H, W) are served (``--shapes`` other than ``any``
        serves only the ``--encode-warmup`` shapes)."""
        if self.encode_served is None or shape in self.encode_served:
            return
        allowed = sorted("x".join(map(str, s)) for s in self.encode_served)
        raise Problem(422, "shape-not-allowed", f"frames {'x'.join(map(str, shape))} are not encoded here "
                      "(--shapes, --encode-warmup)", expected=allowed, received="x".join(map(str, shape)))

    def denormalize(self, latents: np.ndarray) -> np.ndarray:
        """``z · latents_std + latents_mean`` per channel, on the host (float32)."""
        return latents * self.std + self.mean


@dataclass
class ServiceState:
    settings: Settings
    metrics: Metrics
    reading: ByteBudget
    worker: Worker | None = None  # set by the lifespan
    phase: Phase = "loading"
    model: ModelState | None = None
    error: str | None = None
    refused: bool = False  # start-up refused to serve as configured: the process exits non-zero

    # -- transitions (event loop only) -----------------------------------------------------------
    def set_ready(self, model: ModelState) -> None:
        self.model = model
        if self.phase == "loading":
            self.phase = "ready"

    def set_failed(self, error: str) -> None:
        if not self.refused:  # the refusal's message is the one to keep
            self.phase, self.error = "failed", error

    def set_refused(self, error: str) -> None:
        """Start-up found the configuration cannot work (``loading.StartupRefused``): fail, then exit."""
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
            self.worker.abort(Problem(503, "unavailable", self.error or reason, headers=self.retry_after()))

    # -- reads -------------------------------------------------------------------------------------
    def retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.retry_after_s)}

    def serving(self) -> tuple[ModelState, Worker]:
        """The model and worker, or 503 while loading, draining or failed."""
        if self.phase != "ready" or self.model is None or self.worker is None:
            detail = self.error if self.phase == "failed" else f"service is {self.phase}"
            raise Problem(503, "unavailable", detail or "unavailable", headers=self.retry_after())
        if self.model.follower:
            assert self.model.slice is not None
            control = self.model.slice.control
            raise Problem(503, "unavailable", f"this is process {control.process_id} of a {control.num_processes}-process "
                          "slice: it follows process 0, which serves requests")
        return self.model, self.worker
