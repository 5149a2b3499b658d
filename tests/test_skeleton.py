import subprocess
import sys

from moepack.runtime import _lib


def test_engine_library_loads():
    assert _lib.version() == "0.1.0"


def test_cli_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "moepack", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0
    for command in ("info", "convert", "export", "verify", "fetch", "torrent", "seed",
                    "plan", "run", "chat", "eval"):
        assert command in out.stdout, command
