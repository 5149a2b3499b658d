"""Engine.cancel (moepack.h mp_set_cancel): a long prompt stops within a layer's work, the
sequence as before it; Ctrl-C reaches it through the CLI's Interrupt, and a serve client that
leaves through its job's cancel event. The long prompts run with the scalar kernels on one
thread (the demo's full context: about 6 s), so that the cancel always finds them running."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from moepack.runtime.engine import Cancelled, Engine
from serve_fixtures import demo_container

SLOW = {"threads": 1, "kernels": "scalar"}


@pytest.fixture(scope="module")
def demo():
    return demo_container()


def _ids(e: Engine, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(0).integers(0, e.vocab_size, n)]


def _cancel_when_busy(e: Engine, cancel: Callable[[], object]) -> threading.Thread:
    """A thread that makes `cancel` once `e` runs a call (the call then takes seconds)."""
    def watch() -> None:
        deadline = time.monotonic() + 60
        while not e._busy and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.02)  # inside the forward pass, past its first check
        cancel()
    t = threading.Thread(target=watch)
    t.start()
    return t


def test_cancel_stops_a_long_prompt_and_the_sequence_is_as_before(demo):
    with Engine(demo, **SLOW) as e, Engine(demo, **SLOW) as fresh:
        ids = _ids(e, e.ctx - 1)
        e.feed(ids[:10])
        before = e.stats()
        watch = _cancel_when_busy(e, e.cancel)
        with pytest.raises(Cancelled, match="cancelled"):
            e.feed(ids[10:])
        watch.join()
        assert e.position == 10 and e.sequence == tuple(ids[:10])
        assert e.stats()["prompt_tokens"] == before["prompt_tokens"]  # not counted as done
        # the next call runs, from the sequence as it was: the same bits as an engine that
        # never saw the cancel (a prompt split into calls of >= 2 tokens gives the same bits)
        assert np.array_equal(e.feed(ids[10:40]), fresh.feed(ids[:40]))


def test_a_cancel_while_no_call_runs_does_nothing(demo):
    """The flag is set only under a running call and cleared as it ends: a cancel that comes
    between calls, or after the call it meant ended, must not stop the next one."""
    with Engine(demo, threads=1) as e:
        assert e.cancel() is False
        e.feed([1, 2, 3])
        assert e.cancel() is False
        e.feed([4, 5])
        assert e.position == 5


def test_ctrl_c_stops_the_engine_call_through_the_cli_interrupt(demo):
    """Python runs its SIGINT handler only once the C call returns; the Interrupt's wakeup thread
    cancels the call instead. Afterwards the old handler and wakeup fd are back."""
    code = f"""
import os, signal, threading, time
import numpy as np
from moepack.runtime.cli import Interrupt
from moepack.runtime.engine import Cancelled, Engine
e = Engine({str(demo)!r}, threads=1, kernels="scalar")
ids = [int(t) for t in np.random.default_rng(0).integers(0, e.vocab_size, e.ctx - 1)]
def kill():
    while not e._busy:
        time.sleep(0.001)
    time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)
with Interrupt() as stop:
    stop.also(e.cancel)
    threading.Thread(target=kill).start()
    t0 = time.monotonic()
    try:
        e.feed(ids)
        print("fed")
    except Cancelled:
        print("cancelled", e.position)
    print("hit", stop.hit)
print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.set_wakeup_fd(-1))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["cancelled 0", "hit True", "True -1"]


def test_a_serve_job_cancelled_in_its_prompt_ends_at_once_and_the_next_runs(demo):
    from moepack.runtime.tokenizer import Tokenizer
    from moepack.serve.generate import Generator
    from moepack.serve.job import Job
    from moepack.serve.vocab import Vocab

    with Engine(demo, **SLOW) as e, Engine(demo, threads=1) as ref:
        vocab = Vocab(Tokenizer.from_container(str(demo)), e.vocab_size)
        gen = Generator(e, vocab)
        ids = _ids(e, e.ctx - 8)
        job = Job(prompt=ids, max_tokens=4, temperature=0.0)
        watch = _cancel_when_busy(e, job.cancel.set)
        done = gen.run(job)
        watch.join()
        assert (done.finish_reason, done.completion_tokens, done.text) == ("cancelled", 0, "")
        assert done.prompt_tokens == 0  # none evaluated: /metrics counts none
        assert e.position == 0 and gen.cached == []
        want = Generator(ref, vocab).run(Job(prompt=ids[:20], max_tokens=5, temperature=0.0))
        got = gen.run(Job(prompt=ids[:20], max_tokens=5, temperature=0.0))
        assert (got.finish_reason, got.text) == (want.finish_reason, want.text)


def test_a_cancel_of_an_ended_job_does_not_stop_the_next(demo):
    """The event loop may set a job's cancel just as the job ends: it must not stop the call
    the worker has started for the next job."""
    from moepack.runtime.tokenizer import Tokenizer
    from moepack.serve.generate import Generator
    from moepack.serve.job import Job
    from moepack.serve.vocab import Vocab

    with Engine(demo, **SLOW) as e:
        gen = Generator(e, Vocab(Tokenizer.from_container(str(demo)), e.vocab_size))
        first = Job(prompt=[1, 2, 3], max_tokens=1, temperature=0.0)
        gen.run(first)
        hook = first.cancel.hook  # as the event loop read it before the job ended
        assert hook is not None
        ids = _ids(e, 300)
        watch = _cancel_when_busy(e, hook)
        done = gen.run(Job(prompt=ids, max_tokens=2, temperature=0.0))
        watch.join()
        assert done.finish_reason == "length" and done.completion_tokens == 2


def test_the_c_flag_stops_a_call_that_starts_under_it_until_cleared(demo):
    """moepack.h: while set, a call that starts stops at once; the caller clears it."""
    with Engine(demo, threads=1) as e:
        e.feed([1, 2, 3])
        e._lib.mp_set_cancel(e._h, 1)
        arr = (np.ctypeslib.ctypes.c_int32 * 2)(4, 5)
        assert e._lib.mp_eval(e._h, arr, 2, None, 0) == -10  # MP_ECANCELED
        assert e._lib.mp_eval(e._h, arr, 2, None, 0) == -10  # still set
        assert e.position == 3
        e._lib.mp_set_cancel(e._h, 0)
        assert e._lib.mp_eval(e._h, arr, 2, None, 0) == 0
        assert e.position == 5


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_run_in_its_prompt_as_ctrl_c_does(demo, sig):
    """`moepack run` killed by a service manager or a closed terminal during a long prompt: the
    Interrupt cancels the engine call (not a death by the signal, not a wait for the prompt's
    end), says so in one line, and exits 128 + the signal."""
    e = Engine(demo, threads=1)
    ids = ",".join(str(t) for t in np.random.default_rng(0).integers(0, e.vocab_size, e.ctx - 8))
    e.close()
    p = subprocess.Popen([sys.executable, "-m", "moepack", "run", str(demo), "--tokens", ids,
                          "-n", "4", "--kernels", "scalar", "--threads", "1", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.5)  # opened, in the prompt (about 10 s on one scalar thread)
        t0 = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        p.kill()
    assert p.returncode == 128 + sig, err
    assert "interrupted" in err and "Traceback" not in err
    assert json.loads(out)["interrupted"] is True
    assert took < 5, took


def test_an_open_cancel_stops_the_trunk_read(demo):
    """Engine(cancel=OpenCancel): a set flag stops the load before its next trunk tensor (a big
    model's trunk takes minutes to read); unset, the engine opens and runs as without it."""
    from moepack.runtime.engine import OpenCancel

    cancel = OpenCancel()
    with Engine(demo, threads=1, cancel=cancel) as e:
        assert e.feed([1, 2]).shape == (e.vocab_size,)
    cancel.set()
    with pytest.raises(Cancelled, match="trunk"):
        Engine(demo, threads=1, cancel=cancel)


def test_a_serve_job_cancelled_just_before_its_prompt_is_not_fed(demo, monkeypatch):
    """A client that leaves after the worker took the job but before the prompt's engine call
    starts: Engine.cancel() finds no call running then, so the call itself asks the job's
    event as it starts (Engine.feed(cancelled=)); the prompt is never evaluated."""
    from moepack.runtime.tokenizer import Tokenizer
    from moepack.serve.generate import Generator
    from moepack.serve.job import Job
    from moepack.serve.vocab import Vocab

    real = Generator._continue

    def leaving(self, job):
        job.cancel.set()  # the client leaves while the prompt is prepared
        return real(self, job)

    monkeypatch.setattr(Generator, "_continue", leaving)
    with Engine(demo, threads=1) as e:
        gen = Generator(e, Vocab(Tokenizer.from_container(str(demo)), e.vocab_size))
        done = gen.run(Job(prompt=_ids(e, 200), max_tokens=4, temperature=0.0))
        assert (done.finish_reason, done.completion_tokens) == ("cancelled", 0)
        assert e.position == 0 and e.stats()["prompt_tokens"] == 0
