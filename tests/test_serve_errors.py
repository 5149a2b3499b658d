"""Bad input gets OpenAI-style errors with the right status and never takes `moepack serve`
down: malformed bodies (a bounded fuzz), wrong types, n > 1, over-long prompts, missing or
wrong API key, oversized bodies, a full queue (429), a client that leaves mid-stream. Then
how it starts and stops: an address it cannot listen on, SIGINT and SIGTERM with requests in
flight."""

from __future__ import annotations

import http.client
import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import openai
import pytest
from serve_fixtures import ServerProcess, demo_container, demo_server

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
KEY = "s3cret-key"


@pytest.fixture(scope="module")
def srv():
    return demo_server()


@pytest.fixture(scope="module")
def strict():
    """Key required, one request may wait, bodies up to 4 KiB."""
    s = ServerProcess(demo_container(), "--api-key", KEY, "--max-queue", "1",
                      "--max-body", "4096")
    yield s
    s.stop()


def post(srv, path: str, body: bytes | str, headers: dict | None = None,
         timeout: float = 30) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        conn.request("POST", path, body=body.encode() if isinstance(body, str) else body,
                     headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        raw = r.read()
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = {"raw": raw.decode(errors="replace")}
        return r.status, obj, {k.lower(): v for k, v in r.getheaders()}
    finally:
        conn.close()


def assert_error(status: int, obj: dict, want: int) -> None:
    assert status == want, obj
    err = obj["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert set(err) == {"message", "type", "param", "code"}


CHAT = "/v1/chat/completions"
OK_CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.parametrize("body,param", [
    ("{not json", None),
    ("", None),
    ("[]", None),
    ('{"messages": "hi"}', "messages"),
    ('{"messages": []}', "messages"),
    ('{"messages": [{"role": "wizard", "content": "x"}]}', "messages.0.role"),
    ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}', "max_tokens"),
    ('{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', "temperature"),
    ('{"messages": [{"role": "user", "content": "x"}], "temperature": 3}', "temperature"),
    ('{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
    ('{"messages": [{"role": "user", "content": "x"}], "stop": [1, 2]}', "stop"),
    ('{"messages": [{"role": "user", "content": "x"}], "n": 2}', "n"),
    ('{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}',
     "response_format.type"),
    ('{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", '
     '"function": {"name": "f"}}]}', "tools"),
])
def test_bad_chat_bodies_are_400(srv, body, param):
    status, obj, _ = post(srv, CHAT, body)
    assert_error(status, obj, 400)
    if param:
        assert obj["error"]["param"] == param


def test_bad_completion_bodies_are_400(srv):
    for body in ('{"prompt": 5}', '{"prompt": [1, "a"]}', '{"prompt": [99999999]}',
                 '{"prompt": "x", "logprobs": 9}', '{"prompt": "x", "echo": true}',
                 '{"model": "demo"}'):
        status, obj, _ = post(srv, "/v1/completions", body)
        assert_error(status, obj, 400)


def test_prompt_longer_than_context_is_400(srv, client=None):
    ctx = srv.get_json("/health")["ctx"]
    body = json.dumps({"model": "demo", "prompt": list(range(5, 5 + ctx + 10))})
    status, obj, _ = post(srv, "/v1/completions", body)
    assert_error(status, obj, 400)
    assert obj["error"]["code"] == "context_length_exceeded"
    assert obj["error"]["param"] == "prompt"  # the field the request has
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="demo", max_tokens=2, messages=[
            {"role": "user", "content": "word " * (ctx + 50)}])
    assert e.value.code == "context_length_exceeded" and e.value.param == "messages"


def _peak_rss_mb(srv) -> int:
    status = open(f"/proc/{srv.proc.pid}/status").read()
    return int(status.split("VmHWM:")[1].split()[0]) // 1024


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "ab " * 1_300_000, "max_tokens": 1}, "prompt"),
    (CHAT, {"messages": [{"role": "user", "content": "word " * 780_000}]}, "messages")])
def test_a_prompt_far_over_the_context_is_refused_untokenized(srv, path, body, param):
    """4 MB of text was tokenized whole before the refusal: seconds with every other client
    waiting, and ~800 MB of memory at the peak."""
    before = _peak_rss_mb(srv)
    status, obj, _ = post(srv, path, json.dumps(body))
    assert_error(status, obj, 400)
    assert obj["error"]["code"] == "context_length_exceeded"
    assert obj["error"]["param"] == param and "characters" in obj["error"]["message"]
    assert _peak_rss_mb(srv) - before < 200
    status, obj, _ = post(srv, CHAT, json.dumps(OK_CHAT))
    assert status == 200


def _chat(field: str) -> str:
    return '{"messages": [{"role": "user", "content": "x"}], ' + field + "}"


@pytest.mark.parametrize("path,body,param,says", [
    # the rule whole, not the one bound or union member pydantic names first
    (CHAT, _chat('"stop": ["a", "b", "c", "d", "e"]'), "stop", "at most 4 strings"),
    (CHAT, _chat('"temperature": NaN'), "temperature", "finite number from 0 to 2"),
    (CHAT, _chat('"temperature": -Infinity'), "temperature", "finite number from 0 to 2"),
    (CHAT, _chat('"top_p": NaN'), "top_p", "finite number above 0"),
    ("/v1/completions", '{"prompt": ["def f():", "def g():"]}', "prompt",
     "batched prompts are not supported"),
    ("/v1/completions", '{"prompt": [[1, 2], [3, 4]]}', "prompt",
     "batched prompts are not supported"),
    ("/v1/completions", '{"prompt": []}', "prompt", "a string or a non-empty list of token ids"),
    (CHAT, '{"messages": [{"role": "user", "content": [{"type": "text"}]}]}',
     "messages.0.content.0.text", "Field required"),
])
def test_refusals_say_the_rule(srv, path, body, param, says):
    status, obj, _ = post(srv, path, body)
    assert_error(status, obj, 400)
    assert obj["error"]["param"] == param and says in obj["error"]["message"], obj


def test_one_prompt_in_a_list_and_text_parts_are_accepted(srv):
    for path, body in (("/v1/completions", {"prompt": ["def f():"], "max_tokens": 2}),
                       ("/v1/completions", {"prompt": [[5, 6, 7]], "max_tokens": 2}),
                       (CHAT, {"messages": [{"role": "user", "content": [
                           {"type": "text", "text": "def "}, {"type": "text", "text": "f"}]}],
                               "max_tokens": 2})):
        status, obj, _ = post(srv, path, json.dumps(body))
        assert status == 200, obj


def test_image_content_is_refused_as_such(srv):
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="demo", max_tokens=2, messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}}]}])
    assert e.value.param == "messages.0.content.1.type"
    assert "only text content parts are supported" in e.value.message


def test_unknown_route_and_method_are_error_objects(srv):
    status, obj, _ = post(srv, "/v1/embeddings", "{}")
    assert_error(status, obj, 404)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    for path in ("/../../etc/passwd", "/static/../app.py", "/%2e%2e/%2e%2e/etc/passwd"):
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        assert r.status == 404 and b"root:" not in body and b"import" not in body, path
    conn.close()
    status, obj, _ = post(srv, "/v1/models", "{}")
    assert_error(status, obj, 405)


def test_fuzz_malformed_bodies_then_healthy(srv):
    rng = random.Random(1234)
    good = json.dumps({**OK_CHAT, "temperature": 0.5, "stop": ["x"], "top_p": 0.9})
    values = [None, True, -1, 0, 1e308, -1e308, 2**70, "", "x" * 300, [], {}, [None], {"a": 1},
              "\ud800", "\x00"]
    fields = ["messages", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "stream",
              "logprobs", "top_logprobs", "tools", "tool_choice", "response_format",
              "stream_options", "max_completion_tokens", "model"]
    statuses = []
    for i in range(150):
        kind = i % 5
        if kind == 0:  # random bytes
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        elif kind == 1:  # a valid body cut short or with a byte flipped
            b = bytearray(good.encode())
            cut = rng.randrange(1, len(b))
            if rng.random() < 0.5:
                body = bytes(b[:cut])
            else:
                b[cut] = rng.randrange(256)
                body = bytes(b)
        elif kind == 2:  # a field with a value of a wrong type or range
            d = json.loads(good)
            d[rng.choice(fields)] = rng.choice(values)
            body = json.dumps(d).encode()
        elif kind == 3:  # a message with a wrong shape
            d = json.loads(good)
            d["messages"] = [rng.choice([{"role": "user"}, {"content": "x"}, "hi", 3,
                                         {"role": "tool", "content": 5},
                                         {"role": "user", "content": [{"type": "image"}]}])]
            body = json.dumps(d).encode()
        else:  # deep nesting
            depth = rng.randrange(100, 5000)
            body = (b'{"messages": ' + b"[" * depth + b"]" * depth + b"}")
        status, obj, _ = post(srv, rng.choice([CHAT, "/v1/completions"]), body)
        statuses.append(status)
        assert status < 500, (body[:200], obj)
        if status != 200:
            assert "error" in obj and obj["error"]["message"], obj
        assert srv.alive()
    assert statuses.count(400) > 100
    assert srv.get_json("/health")["status"] == "ok"
    status, obj, _ = post(srv, CHAT, json.dumps(OK_CHAT))
    assert status == 200 and obj["choices"][0]["message"]["role"] == "assistant"


def test_huge_header_is_431_not_buffered(srv):
    """uvicorn alone buffers a header of any size (200 MB took 200 MB); the protocol stops at
    MAX_HEAD_BYTES. Sent whole, so that the answer is not lost to a reset."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (256 << 10))
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), raw[:200]
    assert json.loads(body)["error"]["code"] == "request_header_fields_too_large"
    assert srv.get_json("/health")["status"] == "ok"


def test_api_key_required(strict):
    status, obj, _ = post(strict, CHAT, json.dumps(OK_CHAT))
    assert_error(status, obj, 401)
    status, obj, _ = post(strict, CHAT, json.dumps(OK_CHAT), {"Authorization": "Bearer nope"})
    assert_error(status, obj, 401)
    assert strict.get_json("/health")["status"] == "ok"  # health stays open
    c = openai.OpenAI(base_url=strict.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        c.models.list()
    c = openai.OpenAI(base_url=strict.url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in c.models.list()] == ["demo"]
    # the scheme is case-insensitive (RFC 9110 11.1); the key is not
    for auth, want in ((f"bearer {KEY}", 200), (f"BEARER {KEY}", 200), (f"Basic {KEY}", 401),
                       (f"Bearer {KEY.upper()}", 401), (f"Bearer{KEY}", 401)):
        status, obj, _ = post(strict, CHAT, json.dumps(OK_CHAT), {"Authorization": auth})
        assert status == want, (auth, obj)
    assert strict.metrics({"Authorization": f"Bearer {KEY}"})["moepack_queue_depth"] == 0


def test_oversized_body_is_413(strict):
    big = json.dumps({**OK_CHAT, "messages": [{"role": "user", "content": "x" * 10000}]})
    status, obj, _ = post(strict, CHAT, big, {"Authorization": f"Bearer {KEY}"})
    assert_error(status, obj, 413)
    # no Content-Length: the limit holds while the chunked body streams in
    conn = http.client.HTTPConnection("127.0.0.1", strict.port, timeout=30)
    conn.request("POST", CHAT, body=(big[i:i + 1000].encode() for i in range(0, len(big), 1000)),
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
                 encode_chunked=True)
    r = conn.getresponse()
    assert_error(r.status, json.loads(r.read()), 413)
    conn.close()
    assert strict.alive()


def test_full_queue_is_429_with_retry_after(strict):
    auth = {"Authorization": f"Bearer {KEY}"}
    long = json.dumps({"model": "demo", "prompt": "def f(x):", "max_tokens": 1000,
                       "temperature": 0, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", strict.port, timeout=60)
    conn.request("POST", "/v1/completions", body=long,
                 headers={"Content-Type": "application/json", **auth})
    running = conn.getresponse()
    assert running.status == 200
    assert running.readline().startswith(b"data: ")  # generation under way
    waiting: list[int] = []
    t = threading.Thread(target=lambda: waiting.append(post(
        strict, "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 2}), auth)[0]))
    t.start()
    deadline = time.monotonic() + 10
    while strict.get_json("/health")["queue_depth"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    status, obj, headers = post(strict, "/v1/completions",
                                json.dumps({"prompt": "x", "max_tokens": 2}), auth)
    conn.close()  # the running stream's client leaves: the waiting one goes next
    t.join(60)
    assert_error(status, obj, 429)
    assert int(headers["retry-after"]) >= 1
    assert waiting == [200]
    m = strict.metrics(auth)
    assert m["moepack_requests_rejected_total"] == 1



def tokens_until_cancelled(srv, before: dict) -> int:
    """Waits (15 s at most) for the server to count a cancelled request; the tokens it made."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        m = srv.metrics()
        if m["moepack_requests_cancelled_total"] > before["moepack_requests_cancelled_total"]:
            return m["moepack_completion_tokens_total"] - before["moepack_completion_tokens_total"]
        time.sleep(0.05)
    pytest.fail("the server did not cancel the generation")


def test_disconnect_mid_stream_cancels_then_healthy(srv):
    before = srv.metrics()
    body = json.dumps({"model": "demo", "prompt": "def f(x):", "max_tokens": 1000,
                       "temperature": 0, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    for _ in range(3):
        assert r.readline().startswith(b"data: ") and r.readline() == b"\n"
    r.close()
    conn.close()
    produced = tokens_until_cancelled(srv, before)
    # the engine checks for a cancel before every token; what it made is what it made before
    # the server saw the socket close (5 here, at ~500 tok/s)
    assert 3 <= produced < 100
    assert srv.alive() and srv.get_json("/health") == {**srv.get_json("/health"), "busy": False}
    status, obj, _ = post(srv, CHAT, json.dumps(OK_CHAT))
    assert status == 200


def test_disconnect_while_waiting_for_a_whole_reply_cancels(srv):
    before = srv.metrics()
    body = json.dumps({"model": "demo", "prompt": "def f(x):", "max_tokens": 1000,
                       "temperature": 0})
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Content-Type": "application/json"})
    time.sleep(0.3)  # generation under way (the demo makes ~500 tok/s)
    conn.close()
    produced = tokens_until_cancelled(srv, before)
    assert produced < 1000
    assert srv.get_json("/health")["status"] == "ok"


def test_disconnect_mid_body_is_no_server_error(srv):
    """A client that closes the socket before its body is in is no 500 and no traceback."""
    key = 'moepack_requests_total{endpoint="/v1/chat/completions",status="%d"}'
    before = srv.metrics()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 100\r\n\r\n{\"messages\"")
        time.sleep(0.2)  # the request is in the app, reading the body
    deadline = time.monotonic() + 10
    while srv.metrics().get(key % 499, 0) == before.get(key % 499, 0):
        assert time.monotonic() < deadline, "the server did not see the disconnect"
        time.sleep(0.05)
    assert srv.metrics().get(key % 500, 0) == before.get(key % 500, 0)
    assert "ClientDisconnect" not in srv.log.read_text()
    assert post(srv, CHAT, json.dumps(OK_CHAT))[0] == 200


def test_max_queue_0_refuses_while_one_runs():
    s = ServerProcess(demo_container(), "--max-queue", "0")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": "def f(x):", "max_tokens": 1000, "temperature": 0, "stream": True}),
                     headers={"Content-Type": "application/json"})
        running = conn.getresponse()
        assert running.readline().startswith(b"data: ")  # generation under way
        status, obj, _ = post(s, "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 2}))
        assert_error(status, obj, 429)
        assert "keeps no queue" in obj["error"]["message"]
        conn.close()
    finally:
        s.stop()


def serve_until_exit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moepack", "serve", str(demo_container()),
                           "--threads", "1", *args], capture_output=True, text=True, timeout=60)


def test_address_it_cannot_listen_on_is_one_error_line_exit_1():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = serve_until_exit("--port", str(port))
    assert r.returncode == 1, r
    assert r.stdout == ""  # no banner before the bind
    assert r.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}: ")
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    # 192.0.2.1 (TEST-NET-1, RFC 5737) is no address of this machine
    r = serve_until_exit("--host", "192.0.2.1", "--port", "8000")
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr.startswith("error: cannot listen on 192.0.2.1:8000: ")
    # before the model loads (minutes for a big one): a budget below the floor is not reached
    r = serve_until_exit("--host", "192.0.2.1", "--port", "8000", "--budget", "1M")
    assert r.returncode == 1 and "cannot listen" in r.stderr and "floor" not in r.stderr, r


LONG = {"model": "demo", "prompt": "def f(x):", "max_tokens": 1000, "temperature": 0}


def test_sigint_ends_streams_with_an_error_answers_the_rest_503_then_exit_130():
    s = ServerProcess(demo_container())
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)
        stream = c.completions.create(**LONG, stream=True)
        next(iter(stream))  # generation under way
        waiting: list = []
        t = threading.Thread(target=lambda: waiting.append(post(
            s, "/v1/completions", json.dumps(LONG))))
        t.start()
        deadline = time.monotonic() + 10
        while s.get_json("/health")["queue_depth"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGINT)
        # the client sees an error event, not a stream that just ends
        with pytest.raises(openai.APIError) as e:
            for _ in stream:
                pass
        assert e.value.code == "server_shutting_down"
        t.join(30)
        status, obj, _ = waiting[0]
        assert_error(status, obj, 503)
        assert obj["error"]["code"] == "server_shutting_down"
        assert s.proc.wait(timeout=30) == 130, s.log.read_text()
        assert time.monotonic() - t0 < 15
        assert "Traceback" not in s.log.read_text()
    finally:
        s.stop()


def test_sigterm_mid_stream_ends_it_with_an_error_then_done_exit_0():
    s = ServerProcess(demo_container())
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        conn.request("POST", "/v1/completions", body=json.dumps({**LONG, "stream": True}),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.readline().startswith(b"data: ")
        t0 = time.monotonic()
        s.proc.terminate()
        events = [e for e in r.read().decode().split("\n\n") if e.strip()]
        # a graceful stop: exit 0, not death by the signal (-15), a crash or a hang
        assert s.proc.wait(timeout=30) == 0, s.log.read_text()
        assert time.monotonic() - t0 < 15
        assert events[-1] == "data: [DONE]", events[-3:]
        err = json.loads(events[-2][len("data: "):])["error"]
        assert err["code"] == "server_shutting_down" and err["type"] == "server_error"
        assert "Traceback" not in s.log.read_text()
        conn.close()
    finally:
        s.stop()


def test_sighup_stops_the_server_as_ctrl_c_does_exit_129():
    """The terminal that started it closed: a graceful stop with 128 + SIGHUP, not a
    KeyboardInterrupt traceback out of uvicorn's loop (nor a death by the signal)."""
    s = ServerProcess(demo_container())
    try:
        s.proc.send_signal(signal.SIGHUP)
        assert s.proc.wait(timeout=30) == 128 + signal.SIGHUP, s.log.read_text()
        assert "Traceback" not in s.log.read_text()
    finally:
        s.stop()


@pytest.mark.parametrize("stopped_by, code", [(None, 130), (signal.SIGTERM, 0)])
def test_a_signal_while_the_model_loads_stops_its_trunk_read(monkeypatch, stopped_by, code):
    """The engine's open is cancelled (Cancelled out of Engine(...)): nothing was in flight, so
    the server ends as a stop, SIGTERM 0 and Ctrl-C 130, with no error line."""
    from moepack.runtime.engine import Cancelled, Engine
    from typer.testing import CliRunner

    from moepack import cliargs
    from moepack.cli import app

    def cancelled(self, *a, **kw):
        raise Cancelled("cancelled while reading the trunk", -10)

    monkeypatch.setattr(cliargs, "_stopped_by", {} if stopped_by is None
                        else {"signal": int(stopped_by)})
    monkeypatch.setattr(Engine, "__init__", cancelled)
    monkeypatch.setattr(Engine, "__del__", lambda self: None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = CliRunner().invoke(app, ["serve", str(demo_container()), "--port", str(port)])
    assert r.exit_code == code, r.output
    assert "error" not in r.output
