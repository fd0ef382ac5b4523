"""The MP4 pool: H.264 answers written off the event loop and off the device thread, on all host
cores, bounded.

Every video has its own ``Mp4Writer`` (the H.264 encoder's state); its calls run in a pool of
``workers`` threads: PyAV releases the GIL inside FFmpeg (``avcodec_send_frame``,
``avcodec_receive_packet``, the RGB to YUV conversion), so threads work in parallel and a process
pool would only add copies of every frame. A video holds one of the ``workers`` slots only while
one of its calls encodes (calls wait for a slot in arrival order): a fragmented MP4 whose reader is
slow, or an MP4 waiting for its next decode step, holds none. Its decoded frames wait with its job
meanwhile, which the device thread sets aside once it holds ``stream_buffer_bytes``
(``service.engine.worker``), and its encoded bytes wait for the socket: host memory stays bounded
while the device and the pool serve others.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from ..codecs.audio import Sound
from ..codecs.video import Mp4Writer
from ..metrics import Metrics


class PooledWriter:
    """One video's ``Mp4Writer`` on the pool: its calls run one after another (never two at once),
    each in a pool thread while it holds a slot; ``discard`` waits for the call in flight before it
    closes the writer."""

    def __init__(self, pool: Mp4Pool, writer: Mp4Writer):
        self._pool = pool
        self.writer = writer
        self._last: concurrent.futures.Future | None = None
        self.seconds = 0.0  # wall time of this video's writer calls

    async def _call(self, fn: Callable[..., bytes], *args: Any) -> bytes:
        async with self._pool.encoding():
            loop = asyncio.get_running_loop()
            start = loop.time()
            self._last = self._pool.executor.submit(fn, *args)
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
    """``workers`` H.264 encodes at once; ``writer(...)`` gives a video its writer, whose calls wait
    for a free slot in arrival order."""

    def __init__(self, workers: int, metrics: Metrics):
        self.workers = workers
        self._metrics = metrics
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vaeserve-mp4")
        self._slots = asyncio.Semaphore(workers)

    @asynccontextmanager
    async def encoding(self) -> AsyncIterator[None]:
        """One slot of the pool, held while one writer call runs. (A call whose waiter was cancelled
        gives the slot back while its thread finishes: the executor's threads bound the work.)"""
        async with self._slots:
            self._metrics.encoders_busy.inc()
            try:
                yield
            finally:
                self._metrics.encoders_busy.dec()

    @asynccontextmanager
    async def writer(self, height: int, width: int, *, fps: int, crf: int, fragmented: bool = False,
                     sound: Sound | None = None) -> AsyncIterator[PooledWriter]:
        """The writer of one video of ``height`` x ``width`` (with its ``sound``), discarded on the
        way out, whatever happened. Holding it holds no slot."""
        writer = PooledWriter(self, Mp4Writer(height, width, fps=fps, crf=crf, fragmented=fragmented, sound=sound))
        try:
            yield writer
        finally:
            writer.discard()
            self._metrics.serialize_seconds.labels("mp4").observe(writer.seconds)

    async def mp4_bytes(self, frames: np.ndarray, *, fps: int, crf: int) -> bytes:
        """A whole video ``(F, H, W, 3)`` uint8 as a faststart MP4."""
        async with self.writer(int(frames.shape[1]), int(frames.shape[2]), fps=fps, crf=crf) as writer:
            await writer.write(frames)
            return await writer.close()

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
