"""How the service joins a multi-host slice: the ``join`` the engine's start-up calls
(``service.engine.startup.startup(join=...)``), given the hooks of the server it runs in
(``service.slice.control.SliceHooks``).

No JAX here: the HTTP layer builds these when it builds the app; the slice itself
(``service.slice.member``, JAX's distributed runtime) is imported by ``join``, in the device thread.
"""

from __future__ import annotations

from collections.abc import Callable

from ..engine.model import ModelState
from ..settings import Settings
from .control import SliceHooks

# A follower waits this much longer than process 0's drain for the STOP that ends its loop.
FOLLOWER_STOP_MARGIN_S = 30.0


def slice_joiner(settings: Settings, hooks: SliceHooks) -> Callable[[], Callable[[ModelState], ModelState]]:
    """The ``join`` of ``startup``: join the slice (before JAX's backends start), then attach the
    loaded model to it (``service.slice.member.attach_slice``)."""

    def join() -> Callable[[ModelState], ModelState]:
        from .member import attach_slice, join_slice  # the slice itself: JAX's distributed runtime

        control = join_slice(settings)
        return lambda model: attach_slice(model, control, settings, hooks)

    return join
