"""Hostile command lines without a model (issue 13): option values out of range, FIFOs where a
file is expected, and the last-resort handler. Each case: the documented message and exit code
(docs/RUNTIME.md, "Exit codes"), one line, no traceback, nothing created in the folder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hostile_snapshot import only_line, snapshot
from typer.testing import CliRunner

from moepack.cli import app

runner = CliRunner()
TIMEOUT = 60  # seconds; a FIFO that blocks would hang forever, so any finish is a pass


def _moepack(args: list[str], cwd: Path, stdin: bytes | None = None,
             prelude: str = "") -> subprocess.CompletedProcess:
    """`python -m moepack ARGS` as a real process, or `prelude` then moepack's app (to plant a
    fault); stderr and stdout together, as a user sees them."""
    cmd = [sys.executable, "-m", "moepack", *args]
    if prelude:
        script = prelude + "\nfrom moepack.cli import app\napp(prog_name='moepack')\n"
        cmd = [sys.executable, "-c", script, *args]
    return subprocess.run(cmd, cwd=cwd, input=stdin if stdin is not None else b"",
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT)


# --- options out of range: usage error, exit 2 ---------------------------------------------

BAD_OPTIONS = [
    (["run", "X", "w", "--threads", "0"], "--threads"),
    (["run", "X", "w", "--threads", "257"], "--threads"),
    (["run", "X", "w", "-n", "-1"], "-n"),
    (["run", "X", "w", "--temp", "-1"], "--temp"),
    (["run", "X", "w", "--temp", "nan"], "--temp"),
    (["run", "X", "w", "--temp", "inf"], "--temp"),
    (["run", "X", "w", "--top-p", "2"], "--top-p"),
    (["run", "X", "w", "--top-p", "nan"], "--top-p"),
    (["run", "X", "w", "--top-p", "0"], "--top-p"),
    (["run", "X", "w", "--top-k", "-5"], "--top-k"),
    (["run", "X", "w", "--presence-penalty", "2.5"], "--presence-penalty"),
    (["chat", "X", "--frequency-penalty", "-3"], "--frequency-penalty"),
    (["run", "X", "w", "--seed", "-1"], "--seed"),
    (["run", "X", "w", "--seed", str(2**64)], "--seed"),
    (["run", "X", "w", "--ctx", "0"], "--ctx"),
    (["run", "X", "w", "--ctx", str(2**31)], "--ctx"),
    (["run", "X", "w", "--budget", "0"], "--budget"),
    (["run", "X", "w", "--budget", "1e9"], "--budget"),
    (["run", "X", "w", "--budget", "nanG"], "--budget"),
    (["run", "X", "w", "--budget", "99999999999T"], "--budget"),
    (["run", "X", "w", "--cache-policy", "fifo"], "--cache-policy"),
    (["run", "X", "--tokens", "1,x"], "--tokens"),
    (["chat", "X", "-n", "0"], "-n"),
    (["chat", "X", "--temp", "nan"], "--temp"),
    (["chat", "X", "--top-k", "-1"], "--top-k"),
    (["eval", "X", "--tokens", "1", "--logits", "o.npy", "--threads", "-2"], "--threads"),
    (["eval", "X", "--tokens", "1", "--logits", "o.npy", "--ctx", "-1"], "--ctx"),
    (["eval", "X", "--tokens", "1", "--logits", "o.npy", "--budget", "-1G"], "--budget"),
    (["plan", "X", "--ctx", "0"], "--ctx"),
    (["plan", "X", "--budget", "8 bananas"], "--budget"),
    (["verify", "X", "--threads", "0"], "--threads"),
    (["verify", "X", "--threads", "100000"], "--threads"),
    (["serve", "X", "--threads", "0"], "--threads"),
    (["serve", "X", "--ctx", "0"], "--ctx"),
    (["serve", "X", "--budget", "nanG"], "--budget"),
    (["serve", "X", "--port", "0"], "--port"),
    (["serve", "X", "--port", "65536"], "--port"),
    (["serve", "X", "--max-queue", "-1"], "--max-queue"),
    (["serve", "X", "--max-body", "10"], "--max-body"),
]


@pytest.mark.parametrize(("args", "option"), BAD_OPTIONS, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else v)
def test_option_out_of_range_is_a_usage_error(args, option, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    line = only_line(r.output)
    assert line.startswith("usage: Invalid value for ") and f"'{option}'" in line, line
    assert f"(see 'moepack {args[0]} --help')" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("args", [
    ["run", "X", "w", "--temp", "nan"], ["run", "X", "w", "--top-p", "nan"],
    ["run", "X", "w", "--presence-penalty", "nan"], ["chat", "X", "--frequency-penalty", "-inf"],
], ids=" ".join)
def test_a_float_option_that_is_not_finite_says_so(args):
    """Not a bound it would break: every comparison with NaN is false."""
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "not a finite number" in only_line(r.output), r.output


def test_nan_temperature_is_refused_by_a_real_process(tmp_path):
    """Before: accepted, and NaN compared false in the sampler, so it decoded greedily."""
    r = _moepack(["run", "X", "w", "--temp", "nan"], tmp_path)
    assert r.returncode == 2
    line = only_line(r.stdout.decode())
    assert line.startswith("usage: Invalid value for '--temp'")
    assert list(tmp_path.iterdir()) == []


def test_engine_refuses_bad_sampling_settings_too():
    """The library refuses what the CLI refuses (moepack serve and scripts call it directly)."""
    from moepack.runtime.engine import _sampler, parse_bytes

    for kw in ({"temperature": float("nan")}, {"temperature": -1.0}, {"top_p": float("nan")},
               {"top_p": 1.5}, {"top_k": -1}):
        args = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, **kw}
        with pytest.raises(ValueError):
            _sampler(**args)
    with pytest.raises(ValueError):
        parse_bytes(2**64)  # ctypes would wrap it to 0 = "default budget"
    assert parse_bytes("1.5GiB") == 3 * 2**29 and parse_bytes("0.1k") == 100


# --- FIFOs: refused before anything opens them ---------------------------------------------

FIFO_CASES = [
    (["plan", "F"], 1, "error: container F is not a regular file (a FIFO)"),
    (["eval", "F", "--tokens", "1,2", "--logits", "out.npy"], 1,
     "error: container F is not a regular file (a FIFO)"),
    (["run", "F", "hello"], 1, "error: container F is not a regular file (a FIFO)"),
    (["chat", "F"], 1, "error: container F is not a regular file (a FIFO)"),
    (["serve", "F", "--port", "1"], 1, "error: container F is not a regular file (a FIFO)"),
    (["export", "F", "out"], 1, "error: F: file: not a regular file"),
    (["fetch", "F", "--dest", "d", "--dry-run"], 1, "error: F: not a regular file"),
    (["seed", "F", "--path", "F"], 1, "error: F: not a regular file"),
    (["info", "F"], 1, "error: F: file: not a regular file"),
    (["verify", "F"], 2, "not verifiable: F: not a regular file"),
    (["verify", "--source", ".", "--expect", "F"], 2,
     "not verifiable: .: expectations file F is not a regular file (a FIFO)"),
]


@pytest.mark.parametrize(("args", "code", "message"), FIFO_CASES, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else str(v))
def test_fifo_is_refused_not_waited_on(args, code, message, tmp_path):
    os.mkfifo(tmp_path / "F")
    before = snapshot(tmp_path)
    r = _moepack(args, tmp_path)  # a blocked open() would hit the timeout (an error)
    assert r.returncode == code, r.stdout
    assert only_line(r.stdout.decode()).startswith(message)
    assert snapshot(tmp_path) == before


def test_torrent_create_of_a_fifo_is_one_line(tmp_path):
    """Refused before the hashing bar starts: the error is the only line."""
    os.mkfifo(tmp_path / "F")
    before = snapshot(tmp_path)
    r = _moepack(["torrent", "create", "F"], tmp_path)
    assert r.returncode == 1
    assert only_line(r.stdout.decode()) == f"error: {tmp_path}/F: not a regular file"
    assert snapshot(tmp_path) == before


def test_fifo_as_the_default_source_manifest(tmp_path):
    """DIR/moepack-source.json in a downloaded folder could be a FIFO: refused, also in --json."""
    os.mkfifo(tmp_path / "moepack-source.json")
    r = runner.invoke(app, ["verify", "--source", str(tmp_path), "--json"])
    assert r.exit_code == 2
    assert "moepack-source.json is not a regular file (a FIFO)" in r.output
    assert '"exit_code": 2' in r.output and "Traceback" not in r.output


# --- the last resort: an exception no command handled --------------------------------------

PLANT = textwrap.dedent("""
    import moepack.cliargs as c
    def fault(*a, **k):
        raise {exc}
    c.file_problem = fault
""")


def test_unexpected_exception_is_one_line_exit_3(tmp_path):
    r = _moepack(["plan", "X"], tmp_path, prelude=PLANT.format(exc="KeyError('planted')"))
    assert r.returncode == 3
    line = only_line(r.stdout.decode())
    assert line.startswith("internal error: KeyError: 'planted': this is a bug, please report it")
    assert "`moepack --debug ...` shows the traceback" in line


def test_debug_flag_shows_the_traceback(tmp_path):
    r = _moepack(["--debug", "plan", "X"], tmp_path, prelude=PLANT.format(exc="KeyError('p')"))
    assert r.returncode == 1  # Python's own exit code for an uncaught exception
    assert "Traceback" in r.stdout.decode() and "KeyError: 'p'" in r.stdout.decode()


def test_unexpected_os_error_is_one_line_exit_1(tmp_path):
    exc = "PermissionError(13, 'Permission denied', 'somewhere')"
    r = _moepack(["plan", "X"], tmp_path, prelude=PLANT.format(exc=exc))
    assert r.returncode == 1
    line = only_line(r.stdout.decode())
    assert line.startswith("error: [Errno 13] Permission denied: 'somewhere'")


def test_usage_errors_are_one_line(tmp_path):
    for args, want in ((["run"], "usage: Missing argument"),
                       (["plan", "X", "--bogus"], "usage: No such option: --bogus"),
                       (["nosuchcommand"], "usage: No such command")):
        r = _moepack(args, tmp_path)
        assert r.returncode == 2
        assert only_line(r.stdout.decode()).startswith(want)


def test_error_messages_cannot_drive_the_terminal(tmp_path):
    """A file name with an escape sequence and a newline is shown escaped, on one line."""
    name = "evil\x1b[2J\nname"
    r = runner.invoke(app, ["plan", str(tmp_path / name)])
    assert r.exit_code == 1
    line = only_line(r.output)
    assert "\x1b" not in line and "evil\\x1b[2J\\nname" in line


def test_info_on_a_missing_file_says_so_once(tmp_path):
    """The reason alone after the path (Python's OSError text repeats both and the errno)."""
    r = _moepack(["info", "gone.moepack"], tmp_path)
    line = only_line(r.stdout.decode())
    assert r.returncode == 1 and line.startswith("error: gone.moepack: "), line
    assert line.count("gone.moepack") == 1 and "Errno" not in line, line
