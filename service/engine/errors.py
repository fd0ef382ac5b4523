"""What the engine refuses or could not do, in its own terms.

The engine knows nothing of HTTP: the HTTP layer maps each of these to a status and a problem
document (``service.http.problems.engine_problem``), and the command-line tools print them.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of the engine's errors; the message is the detail a client may read."""


class QueueFull(EngineError):
    """``waiting`` requests already wait for the device (or are being read); the queue holds ``limit``."""

    def __init__(self, waiting: int, limit: int):
        super().__init__(f"{waiting} requests are already waiting")
        self.waiting, self.limit = waiting, limit


class Unavailable(EngineError):
    """The engine takes no work now: loading, draining, shutting down, failed, or this process
    follows process 0 of a multi-host slice. Retrying later (or elsewhere) may succeed."""


class DeadlineExceeded(EngineError):
    """The request waited past its deadline before the device got to it."""


class ShapeNotServed(EngineError):
    """``--shapes`` does not serve this input: ``received`` names it, ``allowed`` lists what is served."""

    def __init__(self, detail: str, *, received: str, allowed: list[str]):
        super().__init__(detail)
        self.received, self.allowed = received, allowed


class NoEncoder(EngineError):
    """Encode asked of a checkpoint without encoder weights."""


class DeviceFailed(EngineError):
    """The device call failed; ``cause`` is the exception's type (its message may name devices)."""

    def __init__(self, operation: str, cause: BaseException):
        super().__init__(f"{operation} failed on the device ({type(cause).__name__})")
        self.operation, self.cause = operation, type(cause).__name__


class StartupRefused(EngineError):
    """The service cannot work as configured (a warm-up program needs more memory than a device
    has): the server exits non-zero with this message instead of failing at the first request."""


class NonFiniteOutput(EngineError):
    """A decode produced NaN/Inf values: ``count`` of them in the request's frames (counted on the
    device before the frames became uint8, where they would have been black)."""

    def __init__(self, count: int):
        super().__init__(f"the decode produced {count} non-finite values")
        self.count = count
