"""Shared by tests/test_serve*.py: the demo container (converted once per test process), a
copy with a tool-calling (Qwen2.5/Hermes) chat template, and real `moepack serve` processes
on 127.0.0.1."""

from __future__ import annotations

import atexit
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "demo" / "model"
_made: dict[str, Path] = {}
_tmp = Path(tempfile.mkdtemp(prefix="moepack-serve-tests-"))
atexit.register(shutil.rmtree, _tmp, True)

# Qwen2.5's chat template (Hermes-style tool calls), the family serve/tools.py calls "hermes"
HERMES_TEMPLATE = (ROOT / "tests" / "data_hermes_template.jinja").read_text()


def _convert(src: Path, name: str) -> Path:
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    out = _tmp / f"{name}.moepack"
    convert(src, out, Settings(), jobs=2)
    return out


def demo_container() -> Path:
    if "demo" not in _made:
        _made["demo"] = _convert(DEMO, "demo")
    return _made["demo"]


def tools_container(template: str) -> Path:
    """The demo model with a chat template that takes tools (only tokenizer_config changes)."""
    if "tools" not in _made:
        src = _tmp / "tools-src"
        shutil.copytree(DEMO, src)
        cfg = json.loads((src / "tokenizer_config.json").read_text())
        cfg["chat_template"] = template
        (src / "tokenizer_config.json").write_text(json.dumps(cfg))
        _made["tools"] = _convert(src, "tools")
    return _made["tools"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m moepack serve FILE --port P ...` until stop()."""

    def __init__(self, container: Path, *args: str, timeout: float = 60.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = _tmp / f"server-{self.port}.log"
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moepack", "serve", str(container), "--port", str(self.port),
             "--threads", "1", *args], stdout=self._out, stderr=subprocess.STDOUT)
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()}")
            try:
                if self.get_json("/health")["status"] == "ok":
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not come up in {timeout} s: {self.log.read_text()}")

    def get_json(self, path: str, headers: dict | None = None) -> dict:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def metrics(self, headers: dict | None = None) -> dict[str, float]:
        req = urllib.request.Request(self.url + "/metrics", headers=headers or {})
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._out.close()


_servers: dict[str, ServerProcess] = {}


def demo_server() -> ServerProcess:
    """One shared server on the demo container for the whole test process."""
    if "demo" not in _servers:
        _servers["demo"] = ServerProcess(demo_container())
    return _servers["demo"]
