"""The MP4 pool: H.264 answers written off the event loop and off the device thread, on all host
cores, bounded.

Up to ``workers`` videos are written at once, each by one ``Mp4Writer`` in a pool of as many
threads: PyAV releases the GIL inside FFmpeg (``avcodec_send_frame``, ``avcodec_receive_packet``,
the RGB to YUV conversion), so threads work in parallel and a process pool would only add copies
of every frame. A request first waits for a free writer (FIFO); meanwhile its decoded frames stay
with its job, which the device thread sets aside once it holds ``stream_buffer_bytes``
(``service.engine.worker``): host memory stays bounded while the device serves others.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from ..codecs.video import Mp4Writer
from ..metrics import Metrics


class PooledWriter:
    """One video's ``Mp4Writer`` on the pool: its calls run one after another (never two at once),
    each in a pool thread; ``discard`` waits for the call in flight before it closes the writer."""

    def __init__(self, executor: concurrent.futures.Executor, writer: Mp4Writer):
        self._executor = executor
        self.writer = writer
        self._last: concurrent.futures.Future | None = None
        self.seconds = 0.0  # wall time of this video's writer calls

    async def _call(self, fn: Callable[..., bytes], *args: Any) -> bytes:
        loop = asyncio.get_running_loop()
        start = loop.time()
        self._last = self._executor.submit(fn, *args)
        try:
            return await asyncio.wrap_future(self._last)
        finally:
            self.seconds += loop.time() - start

    async def write(self, frames: np.ndarray) -> bytes:
        """Write ``(f, H, W, 3)`` uint8 frames; the MP4 bytes ready so far (fragmented writers)."""
        return await self._call(self.writer.write, frames)

    async def close(self) -> bytes:
        """Flush the H.264 encoder and finish the file: the rest of the bytes."""
        return await self._call(self.writer.close)

    def discard(self) -> None:
        """Give the writer up (safe after ``close``). A call still running in its thread (its
        awaiting task was cancelled) keeps the writer until it returns: it is closed then."""
        last = self._last
        if last is not None and not last.done():
            last.add_done_callback(lambda _: self.writer.discard())
        else:
            self.writer.discard()


class Mp4Pool:
    """``workers`` MP4 writers at once; ``writer(...)`` waits for a free one, in arrival order."""

    def __init__(self, workers: int, metrics: Metrics):
        self.workers = workers
        self._metrics = metrics
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vaeserve-mp4")
        self._slots = asyncio.Semaphore(workers)

    @asynccontextmanager
    async def writer(self, height: int, width: int, *, fps: int, crf: int,
                     fragmented: bool = False) -> AsyncIterator[PooledWriter]:
        """A free writer for one video of ``height`` x ``width``, given back (and discarded) on the
        way out, whatever happened."""
        async with self._slots:
            self._metrics.encoders_busy.inc()
            writer = PooledWriter(self._executor, Mp4Writer(height, width, fps=fps, crf=crf, fragmented=fragmented))
            try:
                yield writer
            finally:
                writer.discard()
                self._metrics.encoders_busy.dec()
                self._metrics.serialize_seconds.labels("mp4").observe(writer.seconds)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
