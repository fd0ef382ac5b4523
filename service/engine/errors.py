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


class SlowReader(EngineError):
    """A stream ended because its reader fell behind (a full buffer for ``seconds``) while others
    needed what it held: its batch-mates the device, or waiting requests the memory of its decode
    state. ``behind_bytes``: the frame bytes it had not taken."""

    def __init__(self, detail: str, *, behind_bytes: int, seconds: float):
        super().__init__(detail)
        self.behind_bytes, self.seconds = behind_bytes, seconds


class ShapeNotServed(EngineError):
    """``--shapes`` does not serve this input: ``received`` names it, ``allowed`` lists what is served."""

    def __init__(self, detail: str, *, received: str, allowed: list[str]):
        super().__init__(detail)
        self.received, self.allowed = received, allowed


class ModelNotServed(EngineError):
    """A request named a model this server does not serve: ``received`` the name, ``served`` the names it serves."""

    def __init__(self, received: str, served: list[str]):
        super().__init__(f"the model {received!r} is not served here; served: {', '.join(served)}")
        self.received, self.served = received, served


class ModelNotNamed(EngineError):
    """A request named no model of a server that serves several (``served``)."""

    def __init__(self, served: list[str]):
        super().__init__(f"this server serves {len(served)} models: name one (the model query parameter, or "
                         f"/v1/models/{{name}}/...): {', '.join(served)}")
        self.served = served


class NoEncoder(EngineError):
    """Encode asked of a checkpoint without encoder weights."""


class DeviceFailed(EngineError):
    """The device call failed; ``cause`` is the exception's type (its message may name devices)."""

    def __init__(self, operation: str, cause: BaseException):
        super().__init__(f"{operation} failed on the device ({type(cause).__name__})")
        self.operation, self.cause = operation, type(cause).__name__


class TooLargeForMemory(EngineError):
    """A request that cannot fit the memory it would run in, refused before anything runs for it: by
    the estimate from the model's shape rules (before compiling), by its compiled program's
    ``memory_analysis()`` (remembered: the same program is refused at once next time), or by the
    host account. ``needed`` and ``available`` are bytes (per device for a program, on the host for
    the host account), ``received`` names the input, ``would_fit`` what would fit instead."""

    def __init__(self, detail: str, *, needed: int, available: int, received: str, would_fit: list[str]):
        super().__init__(detail)
        self.needed, self.available, self.received, self.would_fit = needed, available, received, would_fit


class OutOfMemory(EngineError):
    """The device or the host (``where``) ran out of memory while the request's program ran, or,
    checked again after such a failure, less memory is free now than the program needs: retrying
    later may succeed."""

    def __init__(self, detail: str, *, where: str):
        super().__init__(detail)
        self.where = where


class StartupRefused(EngineError):
    """The service cannot work as configured (a warm-up program needs more memory than a device
    has): the server exits non-zero with this message instead of failing at the first request."""


class NonFiniteOutput(EngineError):
    """A decode produced NaN/Inf values: ``count`` of them in the request's frames (counted on the
    device before the frames became uint8, where they would have been black)."""

    def __init__(self, count: int):
        super().__init__(f"the decode produced {count} non-finite values")
        self.count = count
