"""The commands as the demo types them: `moepack seed` in a subprocess, then `moepack fetch`."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from moepack.format.synthetic import mixtral_spec, write_synthetic
from typer.testing import CliRunner

from moepack.cli import app

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def made(tmp_path: Path) -> tuple[Path, Path, str]:
    path = tmp_path / "demo.moepack"
    cid = write_synthetic(path, mixtral_spec(layers=2, experts=4))
    torrent = tmp_path / "demo.torrent"
    r = CliRunner().invoke(app, ["torrent", "create", str(path), "-o", str(torrent)])
    assert r.exit_code == 0, r.output
    return path, torrent, cid


def test_seed_process_and_fetch_command(made, tmp_path: Path) -> None:
    path, torrent, cid = made
    port = _free_port()
    seeder = subprocess.Popen([sys.executable, "-m", "moepack", "seed", str(torrent), "--path",
                               str(path), "--listen", f"127.0.0.1:{port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert seeder.stdout is not None
        first = seeder.stdout.readline()
        assert f"on port {port}" in first and cid in first, first
        runner = CliRunner()
        dry = runner.invoke(app, ["fetch", str(torrent), "--dest", str(tmp_path / "f"),
                                  "--dry-run"])
        assert dry.exit_code == 0 and "fits" in dry.output and cid in dry.output, dry.output
        r = runner.invoke(app, ["fetch", str(torrent), "--dest", str(tmp_path / "f"),
                                "--peer", f"127.0.0.1:{port}", "--stall-timeout", "20"])
        assert r.exit_code == 0, r.output
        assert f"verified, container {cid}" in r.output
    finally:
        seeder.terminate()
        assert seeder.wait(timeout=10) == 0, "SIGTERM stops seeding cleanly"
    assert (tmp_path / "f" / path.name).read_bytes() == path.read_bytes()


def test_seed_refuses_a_file_that_is_not_the_container(made, tmp_path: Path) -> None:
    path, torrent, _ = made
    runner = CliRunner()
    short = tmp_path / "short.moepack"
    short.write_bytes(path.read_bytes()[:-64])
    r = runner.invoke(app, ["seed", str(torrent), "--path", str(short), "--listen", "127.0.0.1:0"])
    assert r.exit_code == 1 and "torrent" in r.output and "bytes" in r.output, r.output
    broken = tmp_path / "broken.moepack"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF          # inside the index: the root hash no longer matches
    broken.write_bytes(bytes(data))
    r = runner.invoke(app, ["seed", str(torrent), "--path", str(broken), "--listen", "127.0.0.1:0"])
    assert r.exit_code == 1 and "does not verify" in r.output, r.output


def test_fetch_rejects_bad_peer_and_source(made, tmp_path: Path) -> None:
    _, torrent, _ = made
    runner = CliRunner()
    r = runner.invoke(app, ["fetch", str(torrent), "--dest", str(tmp_path), "--peer", "nope"])
    assert r.exit_code == 2 and "expected HOST:PORT" in r.output
    r = runner.invoke(app, ["fetch", "magnet:?xt=bogus", "--dest", str(tmp_path)])
    assert r.exit_code == 1 and "malformed magnet" in r.output


def test_seed_refuses_a_busy_port(made) -> None:
    path, torrent, _ = made
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = CliRunner().invoke(app, ["seed", str(torrent), "--path", str(path), "--listen",
                                     f"127.0.0.1:{port}", "--duration", "1"])
    assert r.exit_code == 1 and "in use" in r.output and "seeding" not in r.output, r.output
