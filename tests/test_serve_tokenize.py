"""Tokenizing a big prompt runs off the server's event loop: while prompts just under the size
the server takes are tokenized, /health and a running stream keep answering."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
from serve_fixtures import ServerProcess, demo_container
from test_serve_errors import post

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
BIG = 4  # big prompts sent at once: one tokenizes, the rest wait their turn
# Measured on a 2-core VM: /health answered within 12 ms and stream chunks came at most 18 ms
# apart while they tokenized; with the tokenizer on the event loop (or on a thread with
# `encode`, which holds the GIL) /health took 170-330 ms and the stream stalled 230-260 ms.
BOUND = 0.15


@pytest.fixture(scope="module")
def srv():
    s = ServerProcess(demo_container())
    yield s
    s.stop()


def _largest_prompt(srv) -> str:
    """Text just under the characters the server tokenizes at all (Preparer.max_chars); far
    more tokens than the context holds, so it is refused after tokenizing."""
    from moepack.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_container(str(demo_container()))
    longest = max(map(len, tok._tok.get_vocab(with_added_tokens=True)))
    limit = 4 * srv.get_json("/health")["ctx"] * longest
    return ("word " * limit)[:limit - 16]


def _stream(srv, arrivals: list[float], started: threading.Event) -> None:
    """A greedy stream as long as the context allows: when each chunk came."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "def read_config(path):", "max_tokens": 4000, "temperature": 0,
         "stream": True}), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    while line := r.readline():
        if line.startswith(b"data: {"):
            arrivals.append(time.perf_counter())
            started.set()
    conn.close()


def _gaps_within(times: list[float], t0: float, t1: float) -> list[float]:
    inside = [t for t in times if t0 <= t <= t1]
    return [b - a for a, b in zip(inside, inside[1:], strict=False)]


def test_tokenizing_big_prompts_leaves_health_and_streams_answering(srv):
    body = json.dumps({"model": "demo", "prompt": _largest_prompt(srv), "max_tokens": 1})
    arrivals: list[float] = []
    started = threading.Event()
    stream = threading.Thread(target=_stream, args=(srv, arrivals, started))
    stream.start()
    assert started.wait(30)
    answers: list[tuple[int, str]] = []

    def big() -> None:
        status, obj, _ = post(srv, "/v1/completions", body, timeout=60)
        answers.append((status, obj["error"]["code"]))

    bigs = [threading.Thread(target=big) for _ in range(BIG)]
    t0 = time.perf_counter()
    for t in bigs:
        t.start()
    health: list[float] = []
    while any(t.is_alive() for t in bigs):
        t = time.perf_counter()
        assert srv.get_json("/health")["status"] == "ok"
        health.append(time.perf_counter() - t)
        time.sleep(0.005)
    busy = time.perf_counter() - t0
    stream.join(60)
    gaps = _gaps_within(arrivals, t0, t0 + busy)
    assert answers == [(400, "context_length_exceeded")] * BIG
    print(f"{BIG} big prompts: {busy:.2f} s; /health max {max(health) * 1e3:.0f} ms over "
          f"{len(health)}; stream chunks max {max(gaps) * 1e3:.0f} ms apart over {len(gaps)}")
    assert len(health) >= 10 and max(health) < BOUND
    assert len(gaps) >= 10 and max(gaps) < BOUND


def test_a_flood_of_big_prompts_is_bounded_by_429s():
    """One tokenizes and --max-queue (1) wait: the rest are told to retry, not queued."""
    s = ServerProcess(demo_container(), "--max-queue", "1")
    try:
        body = json.dumps({"model": "demo", "prompt": _largest_prompt(s), "max_tokens": 1})
        answers: list[tuple[int, str, bool]] = []

        def big() -> None:
            status, obj, headers = post(s, "/v1/completions", body, timeout=60)
            answers.append((status, obj["error"]["code"], "retry-after" in headers))

        flood = [threading.Thread(target=big) for _ in range(8)]
        for t in flood:
            t.start()
        for t in flood:
            t.join(60)
        assert set(answers) == {(400, "context_length_exceeded", False),
                                (429, "rate_limit_exceeded", True)}, answers
        refused = sum(status == 429 for status, _, _ in answers)
        assert s.metrics()["moepack_requests_rejected_total"] == refused
        assert s.get_json("/health")["status"] == "ok"
    finally:
        s.stop()
