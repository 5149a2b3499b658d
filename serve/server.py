"""Listening sockets and uvicorn's server, stopped the way moepack documents (docs/RUNTIME.md,
"Exit codes"; README "Serving")."""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

BACKLOG = 2048  # uvicorn's default
# the most seconds uvicorn waits for the requests in flight after a stop; they are answered at
# once (app.Server.stop_requests), so only a client that reads slowly takes that long
DRAIN_SECONDS = 5


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen(host: str, port: int) -> list[socket.socket]:
    """A listening socket on each address `host` names, as asyncio's create_server makes them
    (the way uvicorn listened on --host). Raises OSError, or ValueError for a name IDNA cannot
    encode; nothing stays open then."""
    socks: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            s = socket.socket(family, kind, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(addr)
            s.listen(BACKLOG)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


class Uvicorn(uvicorn.Server):
    """The first SIGINT or SIGTERM calls `on_stop` (which answers the requests in flight at
    once), then uvicorn stops as usual; a second Ctrl-C skips its wait for them. The signal
    is kept in `stop_signal`, not re-raised once stopped as uvicorn's own capture_signals
    does (SIGTERM would then end the process by the signal), so that the command exits with
    its documented code."""

    def __init__(self, app: ASGIApp, on_stop: Callable[[], None]) -> None:
        super().__init__(uvicorn.Config(app, log_level="warning",
                                        timeout_graceful_shutdown=DRAIN_SECONDS))
        self.on_stop = on_stop
        self.stop_signal: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        old = {sig: signal.signal(sig, self.handle_exit)
               for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stop_signal is None:
            self.stop_signal = sig
            self.on_stop()
        super().handle_exit(sig, frame)
