"""Headless Chromium for the chat-page test: found on PATH or installed from Debian's package
(`apt-get install chromium`, as root: what `make chromium` does too), driven over the DevTools
protocol with `websockets` (no Playwright, no downloaded browser builds)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from websockets.sync.client import connect

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_or_install() -> tuple[str | None, str]:
    """(path, "") or (None, why not)."""
    for n in NAMES:
        if shutil.which(n):
            return shutil.which(n), ""
    if os.name != "posix" or os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, "no chromium on PATH and not root with apt-get to install Debian's package"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, timeout=120,
                       capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env, check=True,
                       timeout=480, capture_output=True)
    except (subprocess.SubprocessError, OSError) as e:
        return None, f"apt-get install chromium failed: {e}"
    path = shutil.which("chromium")
    return (path, "") if path else (None, "apt-get installed no chromium binary")


class Browser:
    """One headless Chromium with one page, spoken to over its DevTools WebSocket."""

    def __init__(self, binary: str, timeout: float = 30.0) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="moepack-chromium-"))
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not start its DevTools server")
            time.sleep(0.1)
        port = int(port_file.read_text().split("\n")[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.loads(r.read()) if t["type"] == "page")
        self._stack = ExitStack()  # websockets wants its connection used as a context manager
        self.ws = self._stack.enter_context(
            connect(page["webSocketDebuggerUrl"], max_size=2**24, open_timeout=10))
        self._id = 0

    def call(self, method: str, timeout: float = 15.0, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expr: str):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expr: str, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = self.eval(expr)
            if v:
                return v
            time.sleep(0.05)
        raise TimeoutError(f"waited {timeout} s for {expr}")

    def type_text(self, text: str) -> None:
        self.call("Input.insertText", text=text)

    def press_enter(self, types: bool = True) -> None:
        """types=False: an Enter that an IME takes to pick a candidate, which types nothing."""
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                      windowsVirtualKeyCode=13, nativeVirtualKeyCode=13,
                      **({"text": "\r"} if kind == "keyDown" and types else {}))

    def close(self) -> None:
        try:
            if getattr(self, "_stack", None):
                self._stack.close()
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
            shutil.rmtree(self.profile, ignore_errors=True)


def browser_or_skip() -> Iterator[Browser]:
    """A headless Chromium for a module's tests (installed first if need be), closed after
    them; the tests are skipped when none can be had."""
    path, why = find_or_install()
    if path is None:
        pytest.skip(f"no browser: {why}")
    b = Browser(path)
    yield b
    b.close()
