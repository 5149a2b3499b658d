"""The Python Engine API misused as a library user would: copies, threads, a generate() whose
sequence changed under it, truncate arguments. Each must give one clear Python exception, never
a crash or a silently wrong result."""

from __future__ import annotations

import copy
import pickle
import threading

import numpy as np
import pytest
from moepack.runtime.engine import Engine, EngineError


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from moepack.format.synthetic import mixtral_spec, write_synthetic

    path = tmp_path_factory.mktemp("api") / "s.moepack"
    write_synthetic(path, mixtral_spec(layers=2, experts=4, hidden=64, inter=64, vocab=64))
    return path


def test_copy_and_pickle_are_refused(model):
    """A copy shared the C handle: closing both freed it twice (a segfault)."""
    with Engine(model, threads=1, ctx=16) as e:
        for f in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="Engine cannot be copied or pickled"):
                f(e)
        assert e.feed([1, 2]).shape == (64,)


def test_truncate_checks_its_argument(model):
    """ctypes wrapped 2**40 to 0 (the KV cache emptied, `sequence` still said 3 tokens) and a
    float reached C before the Python side refused it."""
    with Engine(model, threads=1, ctx=16) as e:
        e.feed([1, 2, 3])
        e.truncate(2**40)  # beyond the position: a no-op, as documented
        assert e.position == 3 and e.sequence == (1, 2, 3)
        for bad in (1.5, "1", True, None):
            with pytest.raises(TypeError, match="truncate needs an integer"):
                e.truncate(bad)
            assert e.position == 3 and e.sequence == (1, 2, 3)
        e.truncate(np.int64(2))
        assert e.position == 2 and e.sequence == (1, 2)


def test_generate_refuses_to_go_on_after_its_sequence_changed(model):
    """A reset, or a second generate, under a half-consumed generate() made it go on from the
    wrong sequence, silently giving other tokens."""
    with Engine(model, threads=1, ctx=32) as e:
        ref = list(e.generate([1, 2], 6))
        g = e.generate([1, 2], 6)
        assert [next(g), next(g)] == ref[:2]
        e.reset()
        with pytest.raises(EngineError, match="sequence changed"):
            next(g)
        g1, g2 = e.generate([1, 2], 6), e.generate([5, 6], 6)
        next(g1)
        next(g2)
        with pytest.raises(EngineError, match="sequence changed"):
            next(g1)
        assert list(g2) == list(e.generate([5, 6], 6))[1:]  # the latest one goes on
        g = e.generate([1, 2], 6)
        next(g)
        e.stats(), e.snapshot(), e.sequence  # reading the engine changes nothing
        assert [ref[0], *g] == ref


def test_concurrent_calls_from_threads_are_serialized(model):
    """The C engine is not thread-safe: two threads' calls interleaved inside it and gave wrong
    logits and spurious errors ("a decode pass holds one token"); each call now runs whole."""
    with Engine(model, threads=2, ctx=64) as e:
        ref = e.logits([1, 2, 3, 4])
        gen_ref = list(e.generate([3, 4], 3))
        wrong, errors = [], []

        def work(k: int) -> None:
            for i in range(200):
                try:
                    if (i + k) % 3 == 0:
                        wrong.append(not np.array_equal(e.logits([1, 2, 3, 4]), ref))
                    elif (i + k) % 3 == 1:
                        out = list(e.generate([3, 4], 3))
                        wrong.append(out != gen_ref)
                    else:
                        e.reset()
                except EngineError as ex:  # only a generate whose sequence another changed
                    errors.append(str(ex))

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not any(wrong)
        assert all("sequence changed" in m for m in errors), set(errors)


def test_close_from_another_thread_waits_for_the_running_call(model):
    e = Engine(model, threads=1, ctx=64)
    errors: list[str] = []

    def work() -> None:
        try:
            for _ in range(300):
                e.logits([1, 2, 3, 4])
        except EngineError as ex:
            errors.append(str(ex))

    t = threading.Thread(target=work)
    t.start()
    e.close()
    t.join()
    e.close()
    assert errors in ([], ["engine is closed"])


class _InterruptedLib:
    """The engine's library, with mp_eval's return cut off by a KeyboardInterrupt (Ctrl-C in a
    long feed lands as the C call returns)."""

    def __init__(self, lib: object) -> None:
        self._real = lib

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def mp_eval(self, *args: object) -> int:
        self._real.mp_eval(*args)
        raise KeyboardInterrupt


def test_sequence_counts_a_feed_interrupted_as_it_returned(model):
    """Ctrl-C in a long feed left `sequence` empty while the engine held the tokens, so a
    snapshot/restore (chat's prefix reuse) went by the wrong tokens."""
    with Engine(model, threads=1, ctx=16) as e:
        e.feed([1])
        lib, e._lib = e._lib, _InterruptedLib(e._lib)
        with pytest.raises(KeyboardInterrupt):
            e.feed([2, 3, 4])
        e._lib = lib
        assert e.position == 4 and e.sequence == (1, 2, 3, 4)
        assert e.snapshot().tokens == (1, 2, 3, 4)


@pytest.mark.parametrize("budget", [1.5, True, float("nan"), [1]])
def test_a_budget_that_is_no_size_is_refused(model, budget):
    """A whole number of bytes or a size string; 1.5 and True read as 1 byte before (a budget
    refusal that named an amount nobody asked for)."""
    from moepack.runtime.engine import plan

    with pytest.raises(TypeError, match="whole number of bytes or a string"):
        Engine(model, budget=budget)
    with pytest.raises(TypeError, match="whole number of bytes or a string"):
        plan(model, budget=budget)
    default = plan(model)["default_bytes"]
    for fine in (np.int64(default), float(default), str(default)):
        with Engine(model, budget=fine) as e:
            assert e.stats()["budget_bytes"] == default


def test_logits_into_a_given_array(model, tmp_path):
    """logits(out=): the same bits written into the caller's array (eval passes a memmap of its
    output file); an array of another type, shape or layout is refused before any work."""
    with Engine(model, threads=1, ctx=16) as e:
        want = e.logits([1, 2, 3])
        mm = np.lib.format.open_memmap(tmp_path / "l.npy", "w+", np.float32, (3, 64))
        assert e.logits([1, 2, 3], out=mm) is mm and np.array_equal(mm, want)
        for bad in (np.zeros((3, 64), np.float64), np.zeros((2, 64), np.float32),
                    np.zeros((64, 3), np.float32).T, [[0.0] * 64] * 3):
            with pytest.raises(ValueError, match="out must be"):
                e.logits([1, 2, 3], out=bad)
        assert e.sequence == (1, 2, 3)  # the refused calls did not reset it
