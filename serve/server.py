"""Listening sockets and uvicorn's server, stopped the way moepack documents (docs/RUNTIME.md,
"Exit codes"; README "Serving")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
from collections.abc import Callable, Iterator
from http import HTTPStatus
from types import FrameType

import uvicorn
from moepack.serve.errors import ApiError
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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


HEAD_TIMEOUT_S = 10.0  # a request line and its headers, from the first byte or the connect
MAX_HEAD_BYTES = 64 << 10  # nginx takes 32 KiB of headers, Node 16 KiB
LINGER_S = 2.0  # after a refusal, how long the rest of that request is read and dropped


class Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits it lacks on a request's head: it must come
    whole within head_timeout seconds (a connection that sends nothing, or a header a byte at a
    time, would hold its socket for ever: enough of them and nobody else gets in) and within
    max_head bytes (it buffers a header of any size). Over either, an error object (408,
    431) and the connection closed; so too for what is not HTTP (400)."""

    head_timeout = HEAD_TIMEOUT_S
    max_head = MAX_HEAD_BYTES

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a keep-alive connection's next request
            self._start_head()

    def on_headers_complete(self) -> None:
        self._end_head()
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        # counted only while a head begun in an earlier chunk is still open: a chunk that ends
        # one request and starts the next is not all head (the bound is max_head + a chunk)
        counting = self._head_timer is not None
        super().data_received(data)
        if counting and self._head_timer is not None:
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head:
                self._refuse(431, f"request headers over {self.max_head} bytes",
                             "request_header_fields_too_large")

    def send_400_response(self, msg: str) -> None:
        # what the parser cannot read, answered like the app's errors (not a plain-text 400)
        self._refuse(400, msg, "invalid_http")

    def _start_head(self) -> None:
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_late)

    def _end_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        self._refuse(408, f"the request line and headers did not come within "
                     f"{self.head_timeout:g} s", "request_timeout")

    def _refuse(self, status: int, message: str, code: str) -> None:
        self._end_head()
        if self._refused or self.transport.is_closing():
            return
        self._refused = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()  # inside another reply (pipelined): no room for ours
            return
        # the answer, then a lingering close: what the client still sends is read and dropped
        # for a moment, since closing with unread bytes would reset the connection and lose
        # the answer before the client reads it
        self.transport.write(_error_response(status, message, code))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


def _error_response(status: int, message: str, code: str) -> bytes:
    """A whole HTTP response with the API's error object, for a request the app never saw."""
    body = json.dumps(ApiError(status, message, code=code).body()).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n")
    return head.encode() + body


class Uvicorn(uvicorn.Server):
    """The first SIGINT, SIGTERM or SIGHUP calls `on_stop` (which answers the requests in flight at
    once), then uvicorn stops as usual; a second Ctrl-C skips its wait for them. The signal
    is kept in `stop_signal`, not re-raised once stopped as uvicorn's own capture_signals
    does (SIGTERM would then end the process by the signal), so that the command exits with
    its documented code."""

    def __init__(self, app: ASGIApp, on_stop: Callable[[], None]) -> None:
        super().__init__(uvicorn.Config(app, log_level="warning", http=Protocol,
                                        timeout_graceful_shutdown=DRAIN_SECONDS))
        self.on_stop = on_stop
        self.stop_signal: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # SIGHUP (the terminal closed) stops it as Ctrl-C does, unless ignored (nohup)
        old = {sig: signal.signal(sig, self.handle_exit)
               for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
               if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN}
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
