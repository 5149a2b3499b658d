"""Request preparation (chat template, tokenizing) off the event loop: a 4 MB prompt takes
seconds to tokenize, and every other client (a /health probe, a running stream) waited for it.
The tokenizer lets go of the GIL while it works (Tokenizer.encode), so the loop runs on."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from moepack.serve.errors import ApiError

T = TypeVar("T")


class Offload:
    """`threads` preparations at once (tokenizing 4 MB peaks near 800 MB, so few), at most
    `waiting` more queued behind them; past that a 429, so that a flood of big prompts holds
    neither threads nor their memory without bound."""

    def __init__(self, threads: int, waiting: int) -> None:
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="moepack-prepare")
        # released when the work ends, not when its awaiter goes (a client that leaves does
        # not stop a tokenizer that has started)
        self._room = threading.BoundedSemaphore(threads + waiting)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        if not self._room.acquire(blocking=False):
            raise ApiError(429, "too many requests are being prepared (tokenized); retry "
                           "later", code="rate_limit_exceeded", headers={"Retry-After": "1"})
        try:
            fut = self.pool.submit(fn, *args)
        except RuntimeError:  # the pool has shut down: the server is stopping
            self._room.release()
            raise ApiError(503, "the server is shutting down",
                           code="server_shutting_down") from None
        fut.add_done_callback(lambda _: self._room.release())
        return await asyncio.wrap_future(fut)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
