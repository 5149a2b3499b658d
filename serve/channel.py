"""Worker thread -> event loop: events pile up under a lock and the loop is woken once per pile
(not once per token), so a busy loop takes several tokens in one go."""

from __future__ import annotations

import asyncio
import threading
from collections import deque


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class Channel:
    def __init__(self) -> None:
        self._items: deque = deque()
        self._lock = threading.Lock()
        self._waiter: asyncio.Future | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def put(self, ev: object) -> None:
        """From any thread."""
        with self._lock:
            self._items.append(ev)
            waiter, self._waiter = self._waiter, None
        if waiter is not None and self.loop is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # the loop shut down under us: nobody is listening
                pass

    async def take(self, timeout: float | None = None) -> list:
        """Everything pending, waiting for at least one event ([] after timeout seconds)."""
        while True:
            with self._lock:
                if self._items:
                    out = list(self._items)
                    self._items.clear()
                    return out
                assert self.loop is not None
                fut = self.loop.create_future()
                self._waiter = fut
            try:
                await asyncio.wait_for(asyncio.shield(fut), timeout)
            except TimeoutError:
                with self._lock:
                    if self._waiter is fut:
                        self._waiter = None
                return []
