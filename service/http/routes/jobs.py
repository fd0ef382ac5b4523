"""The life of a decode or encode request, shared by both routes: reserve a queue slot, read and
parse the body (holding what it needs for as long as the request lives), submit the job, answer;
499 when the client leaves on the way."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from ...engine.jobs import Job
from ...engine.model import ModelState
from ..admission import read_body
from ..problems import CLIENT_GONE, ClientGone
from ..state import ServiceState

log = logging.getLogger("vaeserve")

Parsed = TypeVar("Parsed")


async def serve_job(request: Request, state: ServiceState, *,
                    parse: Callable[[bytes, ModelState, AsyncExitStack, float], Awaitable[Parsed]],
                    make_job: Callable[[Parsed, float], Job],
                    answer: Callable[[Job, Parsed], Awaitable[Response]],
                    before_body: Callable[[ModelState], None] | None = None) -> Response:
    """``parse(body, model, holds, arrived)`` turns the body into the job's inputs (its heavy work
    in a thread), entering into ``holds`` whatever it must hold until the request ends (memory
    budgets); ``make_job(parsed, arrived)`` builds the job that is submitted; ``answer(job,
    parsed)`` waits for it (or streams it) and renders the response. ``before_body(model)`` may
    refuse the request before a byte of the body is read."""
    arrived = time.monotonic()
    model, worker = state.serving()
    if before_body is not None:
        before_body(model)
    ticket = worker.reserve()  # 429 here, before a byte of the body is read
    settings = state.settings
    holds = AsyncExitStack()
    try:
        async with read_body(request, max_bytes=settings.max_body_bytes, budget=state.reading,
                             timeout_s=settings.read_timeout_s, retry_after_s=settings.retry_after_s) as body:
            parsed = await parse(body, model, holds, arrived)
        job = make_job(parsed, arrived)
        worker.submit(job, ticket)
        response = await answer(job, parsed)
    except ClientGone as gone:
        log.info("request %s: %s", request.state.request_id, gone)
        return Response(status_code=CLIENT_GONE)
    finally:
        ticket.release()  # a no-op once the job was submitted
        await holds.aclose()
    if not isinstance(response, StreamingResponse):  # a stream's whole time is not known yet
        state.metrics.total_seconds.observe(time.monotonic() - arrived)
    return response
