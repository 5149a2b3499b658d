"""SIGTERM and SIGHUP stop a command as Ctrl-C does (docs/RUNTIME.md, "Exit codes"): its clean
stop, one line, exit 128 + the signal (130, 143, 129); never a death by the signal that skips
the cleanup. A SIGHUP that nohup ignores stays ignored."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

# a command that waits: the stop no command handles itself (info, verify, plan ...)
NAP = """
import signal, sys, time
from moepack.cli import app
if "nohup" in sys.argv:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
@app.command("nap")
def nap() -> None:
    print("ready", flush=True)
    time.sleep(60)
    print("woke")
app(["nap"], prog_name="moepack")
"""


def _nap(*signals: signal.Signals, nohup: bool = False) -> subprocess.CompletedProcess:
    p = subprocess.Popen([sys.executable, "-c", NAP, *(["nohup"] if nohup else [])],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        for sig in signals:
            p.send_signal(sig)
        out, err = p.communicate(timeout=20)
    finally:
        p.kill()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_a_command_with_one_line_and_128_plus_the_signal(sig):
    r = _nap(sig)
    assert r.returncode == 128 + sig, (r.returncode, r.stderr)
    assert r.stderr.strip() == "interrupted" and "Traceback" not in r.stderr
    assert "woke" not in r.stdout


def test_a_sighup_ignored_by_nohup_stays_ignored():
    r = _nap(signal.SIGHUP, signal.SIGTERM, nohup=True)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr


# a command inside runtime/cli.py's Interrupt (as run, chat and eval generate): the first stop
# signal only asks the work to stop; a second SIGTERM must end the process at once
WAIT = """
import time
from moepack.cli import app
from moepack.runtime.cli import Interrupt
@app.command("wait")
def wait() -> None:
    with Interrupt() as stop:
        print("ready", flush=True)
        deadline, said = time.monotonic() + 30, False
        while time.monotonic() < deadline:  # a stubborn step that goes on after stop.hit
            if stop.hit and not said:
                print("hit", flush=True)
                said = True
            time.sleep(0.01)
    print("done")
app(["wait"], prog_name="moepack")
"""


def test_a_second_sigterm_ends_a_stubborn_stop_at_once():
    p = subprocess.Popen([sys.executable, "-c", WAIT], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        p.send_signal(signal.SIGTERM)
        assert p.stdout.readline() == "hit\n"  # handled: a second one is not merged into it
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == -signal.SIGTERM and "done" not in out
