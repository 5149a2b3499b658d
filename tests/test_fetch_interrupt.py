"""Ctrl-C (a real SIGINT to a `moepack fetch hf:…` process) stops within seconds, even while the
hub stalls mid-body or an existing file is being hashed, keeps the .incomplete, exits 130."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hub_server import Fault, HubRepo, HubServer
from range_server import wait_for

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]

REPO = "org/stall"
NAME = "model.safetensors"
DATA = b"".join(hashlib.blake2b(b"%d" % i, digest_size=64).digest() for i in range(4096))


def _fetch(server: HubServer, dest: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "HF_ENDPOINT": server.base}
    env.pop("HF_TOKEN", None)
    return subprocess.Popen([sys.executable, "-m", "moepack", "fetch", f"hf:{REPO}", "--dest",
                             str(dest), *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _interrupt(p: subprocess.Popen) -> tuple[int, float, str]:
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        out, _ = p.communicate(timeout=10)
    finally:
        p.kill()
    return p.returncode, time.monotonic() - t0, out


def test_ctrl_c_while_the_hub_stalls(tmp_path: Path) -> None:
    with HubServer({REPO: HubRepo({NAME: DATA})}) as server:
        server.inject(REPO, NAME, Fault("stall", times=-1, at=100_000))
        p = _fetch(server, tmp_path, "--stall-timeout", "60")
        part = tmp_path / (NAME + ".incomplete")
        assert wait_for(lambda: part.is_file() and part.stat().st_size == 100_000, 20)
        time.sleep(0.5)   # blocked in the stalled read
        rc, took, out = _interrupt(p)
    assert rc == 130, out
    assert took < 4, f"took {took:.1f} s to stop"
    assert "interrupted" in out and "Traceback" not in out
    assert part.read_bytes() == DATA[:100_000], "the partial file is kept for the rerun"


SIZE = 64 << 30   # sparse: no disk used, and hashing it takes far longer than the test


def _huge_listing() -> bytes:
    return json.dumps([{"type": "file", "oid": "0" * 40, "size": SIZE, "path": NAME,
                        "lfs": {"oid": "ab" * 32, "size": SIZE, "pointerSize": 134}}]).encode()


def test_ctrl_c_while_hashing_a_file_already_there(tmp_path: Path) -> None:
    """A partial download is hashed before it resumes (the space check only counts the
    missing byte, so this runs on any disk)."""
    part = tmp_path / (NAME + ".incomplete")
    with open(part, "wb") as f:
        f.truncate(SIZE - 1)
    with HubServer({REPO: HubRepo({NAME: b"x"}, tree=_huge_listing())}) as server:
        p = _fetch(server, tmp_path)
        time.sleep(3.0)
        assert p.poll() is None, p.communicate()[0]
        rc, took, out = _interrupt(p)
    assert rc == 130, out
    assert took < 4, f"took {took:.1f} s to stop"
    assert part.stat().st_size == SIZE - 1, "the file is left as it was"


def test_ctrl_c_while_hashing_a_same_size_file(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of the listed size is hashed first; in-process, since the space check rightly
    wants room for downloading it again, which a test machine may not have."""
    from moepack.fetch.hub import fetch_hub, plan_hub

    with open(tmp_path / NAME, "wb") as f:
        f.truncate(SIZE)
    hashing: list[int] = []
    with HubServer({REPO: HubRepo({NAME: b"x"}, tree=_huge_listing())}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.base)
        plan = plan_hub(f"hf:{REPO}", tmp_path, [])
        timer = threading.Timer(1.0, signal.pthread_kill, (threading.main_thread().ident,
                                                          signal.SIGINT))
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            fetch_hub(plan, on_hashing=hashing.append)
        took = time.monotonic() - t0
    assert hashing[:1] == [1] and took < 3, f"took {took:.1f} s to stop"
    assert (tmp_path / NAME).stat().st_size == SIZE, "the file is left as it was"
