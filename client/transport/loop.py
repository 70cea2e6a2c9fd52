"""The loop thread behind the synchronous faces: an asyncio loop in a daemon thread.

``LoopThread`` runs an asyncio loop in a daemon thread: ``submit(coro)`` ->
``concurrent.futures.Future``, ``run(coro, timeout_s)``, ``call_soon(fn, ...)``, ``close()``.
Each synchronous client (Producer, Consumer) owns one LoopThread and closes it in ``close()``
(no process-wide shared loop: a client's close never disturbs another client).

Thread-safety: every method is thread-safe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from pymetaq.client.errors import ClientClosed, RequestTimeout

T = TypeVar("T")

log = logging.getLogger(__name__)


class LoopThread:
    """An asyncio event loop running in a daemon thread (the synchronous faces' engine)."""

    def __init__(self, name: str = "pymetaq-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._started.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()

    @property
    def closed(self) -> bool:
        return self._closed

    def in_loop(self) -> bool:
        """True when called from the loop's own thread."""
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; returns a thread-safe future."""
        if self._closed:
            coro.close()
            raise ClientClosed("the client's loop thread is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and wait; a timeout cancels it and raises RequestTimeout."""
        if self.in_loop():
            coro.close()
            raise RuntimeError("LoopThread.run() called from its own loop thread (would deadlock)")
        fut = self.submit(coro)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise RequestTimeout(f"operation did not finish within {timeout_s:g}s") from None

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on the loop thread (thread-safe)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def close(self, timeout_s: float = 5.0) -> None:
        """Cancel remaining tasks, stop the loop, join the thread and close the loop."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(timeout_s)
            except concurrent.futures.TimeoutError:
                log.warning("%s: tasks still running after %gs; stopping anyway", self, timeout_s)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("%s: loop thread did not stop within %gs", self, timeout_s)
        else:
            self.loop.close()


async def _cancel_all() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0)  # let transports' close callbacks run
