import subprocess
import sys

from moepack.runtime import _lib

import moepack


def test_engine_library_loads_and_has_the_package_version():
    assert _lib.version() == moepack.__version__  # one definition, passed in by setup.py


def test_cli_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "moepack", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0
    for command in ("info", "convert", "export", "verify", "fetch", "torrent", "seed",
                    "plan", "run", "chat", "eval"):
        assert command in out.stdout, command
