"""A Range-capable HTTP/1.1 file server on 127.0.0.1, with fault injection.

Python's http.server ignores Range (web seeds stall on it), so tests need this. `LoopbackServer`
is the shared machinery: subclasses answer `route()`; byte bodies get Range, HEAD, ETag and
faults here. `RangeServer` serves a dict of files (web-seed tests); tests/hub_server.py builds
the hub's endpoints on the same base.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Body:
    """A response: bytes served with Range support, or a redirect / error when `status` says so."""

    data: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/octet-stream"


@dataclass
class Fault:
    """What goes wrong for one path, for the next `times` GETs (-1: every time).

    kind: "drop" (close after `at` bytes of the body), "corrupt" (flip a byte at `at`),
    "stall" (send `at` bytes, then nothing until the server stops), "404", "answer" (send
    `answer` instead: a 503 with Retry-After, a redirect to itself), "ignore-range" (the
    whole body with 200, whatever Range asked for).
    `delay`: seconds to wait before answering at all.
    """

    kind: str
    times: int = 1
    at: int = 0
    delay: float = 0.0
    answer: Body | None = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 — quiet tests
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        owner = self.server.owner
        parts = urlsplit(self.path)
        path, query = unquote(parts.path), parse_qs(parts.query)
        rng = self.headers.get("Range")
        owner.requests.append((self.command, path, rng))
        fault = None if head else owner.take_fault(path)
        if fault is not None and fault.delay:
            owner.stopping.wait(fault.delay)
        if fault is not None and fault.kind == "404":
            body = Body(b"not found", 404, {"X-Error-Code": "EntryNotFound"}, "text/plain")
        elif fault is not None and fault.answer is not None:
            body, fault = fault.answer, None
        else:
            body = owner.route(self.command, path, query, self)
        self._send(body, rng, head, fault)

    def _send(self, body: Body, rng: str | None, head: bool, fault: Fault | None) -> None:
        data, status, start = body.data, body.status, 0
        headers = dict(body.headers)
        if status == 200 and rng and not (fault and fault.kind == "ignore-range"):
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m or int(m.group(1)) >= len(data) > 0:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else len(data) - 1
            end = min(end, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start:end + 1], 206
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if status in (200, 206):
            self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", body.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if head:
            return
        self._body(data, start, fault)

    def _body(self, data: bytes, start: int, fault: Fault | None) -> None:
        owner = self.server.owner
        if fault is None or fault.kind in ("404", "ignore-range"):
            self.wfile.write(data)
            owner.sent += len(data)
            return
        cut = max(0, min(len(data), fault.at - start))
        if fault.kind == "corrupt":
            if 0 <= cut < len(data):
                data = data[:cut] + bytes([data[cut] ^ 0xFF]) + data[cut + 1:]
            self.wfile.write(data)
            owner.sent += len(data)
            return
        self.wfile.write(data[:cut])
        self.wfile.flush()
        owner.sent += cut
        if fault.kind == "stall":
            owner.stopping.wait()   # "never finishes": holds the connection until shutdown
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: LoopbackServer


class LoopbackServer:
    """Threaded HTTP/1.1 server on 127.0.0.1:<free port>; a context manager."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        self.faults: dict[str, Fault] = {}
        self.sent = 0
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self.port = self._httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def route(self, method: str, path: str, query: dict[str, list[str]],
              handler: BaseHTTPRequestHandler) -> Body:
        raise NotImplementedError

    def take_fault(self, path: str) -> Fault | None:
        with self._lock:
            f = self.faults.get(path)
            if f is None or f.times == 0:
                return None
            if f.times > 0:
                f.times -= 1
            return f

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class RangeServer(LoopbackServer):
    """Serves `files` (URL path without the leading '/' -> bytes)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__()
        self.files = files

    def url(self, name: str) -> str:
        return f"{self.base}/{name}"

    def route(self, method: str, path: str, query: dict[str, list[str]],
              handler: BaseHTTPRequestHandler) -> Body:
        data = self.files.get(path.lstrip("/"))
        if data is None:
            return Body(b"not found", 404, content_type="text/plain")
        return Body(data, headers={"ETag": f"\"{hashlib.sha1(data).hexdigest()}\""})


def wait_for(predicate, timeout: float, step: float = 0.05) -> bool:  # noqa: ANN001
    """Poll `predicate` until true or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())
