"""The HTTP layer of `moepack serve` (serve/server.py's Protocol, app.Server.body) against
clients that never finish a request: a connection that sends nothing, a header dripped a byte
at a time, a header of megabytes, a body that never ends. A real uvicorn on 127.0.0.1 in this
process, with short timeouts, so that these take a second, not the production 10 s and 60 s."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from moepack.serve import server
from moepack.serve.app import ServeConfig, create_app
from serve_fixtures import demo_container

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]
TIMEOUT = 0.5


class _Fast(server.Protocol):
    head_timeout = TIMEOUT
    max_head = 4096


async def _app(scope, receive, send) -> None:
    """200 "ok", after sleeping ?S seconds (a long generation)."""
    if scope["type"] != "http":
        return
    await asyncio.sleep(float(scope["query_string"] or 0))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _serve(app) -> Iterator[int]:
    sock = server.listen("127.0.0.1", 0)[0]
    srv = uvicorn.Server(uvicorn.Config(app, http=_Fast, log_level="warning"))
    t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    while not srv.started:
        time.sleep(0.01)
    yield sock.getsockname()[1]
    srv.should_exit = True
    t.join(10)


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    yield from _serve(_app)


@pytest.fixture(scope="module")
def api_port() -> Iterator[int]:
    """moepack's app on the demo model."""
    app, _ = create_app(ServeConfig(path=str(demo_container()), model_id="demo", threads=1,
                                    body_timeout=TIMEOUT))
    yield from _serve(app)


def _read_all(s: socket.socket, limit: float = 10) -> tuple[bytes, float]:
    """Everything until the server closes; the seconds that took."""
    t0, out = time.monotonic(), b""
    s.settimeout(limit)
    while chunk := s.recv(65536):
        out += chunk
    return out, time.monotonic() - t0


def _error(raw: bytes, status: int) -> dict:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), raw[:200]
    assert b"connection: close" in head.lower()
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_a_connection_that_sends_nothing_gets_408_and_is_closed(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
        raw, took = _read_all(s)
    assert _error(raw, 408)["code"] == "request_timeout"
    assert TIMEOUT * 0.8 < took < TIMEOUT + 3


def test_a_header_dripped_a_byte_at_a_time_gets_408(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
        t0 = time.monotonic()
        s.settimeout(0.05)  # each wait for the answer is the drip's pause
        raw = b""
        for b in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            s.sendall(bytes([b]))
            try:
                raw = s.recv(65536)
                break
            except TimeoutError:
                pass
        more, _ = _read_all(s)
    assert _error(raw + more, 408)["code"] == "request_timeout"
    assert time.monotonic() - t0 < TIMEOUT + 3


def test_a_huge_header_gets_431_and_is_closed(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
        # all of it is read before the refusal (bytes left unread would turn the close into a
        # reset that loses the answer); a longer one is cut off there just the same
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 3 * _Fast.max_head)
        raw, _ = _read_all(s)
    assert _error(raw, 431)["code"] == "request_header_fields_too_large"


def test_what_is_not_http_gets_a_400_error_object(port):
    for junk in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(junk)
            raw, _ = _read_all(s)
        assert _error(raw, 400)["code"] == "invalid_http", junk


def test_keep_alive_pipelining_and_long_replies_are_not_cut(port):
    req = b"GET /?%s HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(req % b"0")
        time.sleep(TIMEOUT * 0.6)  # idle between requests of a keep-alive connection
        # a reply that takes longer than the head timeout, with the next request pipelined
        s.sendall(req % str(TIMEOUT * 2).encode() + req % b"0" +
                  b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw, _ = _read_all(s)
    assert raw.count(b"HTTP/1.1 200 OK") == 4, raw


def test_a_body_that_never_ends_gets_408_and_the_server_goes_on(api_port):
    with socket.create_connection(("127.0.0.1", api_port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
        raw, took = _read_all(s)
    assert _error(raw, 408)["code"] == "request_timeout"
    assert took < TIMEOUT + 3
    with socket.create_connection(("127.0.0.1", api_port)) as s:
        body = b'{"prompt": "def", "max_tokens": 2}'
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        raw, _ = _read_all(s)
    assert raw.startswith(b"HTTP/1.1 200 ") and b'"text_completion"' in raw, raw[:300]
