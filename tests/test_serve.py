"""`moepack serve` on the demo container, driven by the official openai package: sync and
async, streaming and not; usage, stop strings, logprobs, seeds, prefix reuse, /metrics."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import openai
import pytest

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
PROMPT = "def read_config(path):"


def test_models_and_health(srv, client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["demo"]
    assert client.models.retrieve("demo").owned_by == "moepack"
    h = srv.get_json("/health")
    assert h["status"] == "ok" and h["ctx"] > 0


def test_completion_matches_moepack_run(client):
    """Greedy text from the server is the engine's own greedy text (same sampler, same BOS)."""
    from moepack.runtime.engine import Engine
    from moepack.runtime.tokenizer import Tokenizer
    from serve_fixtures import demo_container

    r = client.completions.create(model="demo", prompt=PROMPT, max_tokens=12, temperature=0)
    tok = Tokenizer.from_container(str(demo_container()))
    ids = tok.encode_prompt(PROMPT)
    with Engine(str(demo_container()), threads=1) as e:
        want = list(e.generate(ids, 12, stop=[tok.eos_id]))
    assert r.choices[0].text == tok.decode(want, skip_special_tokens=True)
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == len(want)
    assert r.usage.total_tokens == len(ids) + len(want)
    assert r.choices[0].finish_reason in ("length", "stop")
    # sampled: the engine's sampler and RNG, so a seed gives what `moepack run --seed` gives
    s = client.completions.create(model="demo", prompt=PROMPT, max_tokens=12, temperature=0.9,
                                  top_p=0.95, seed=5)
    with Engine(str(demo_container()), threads=1) as e:
        want = list(e.generate(ids, 12, temperature=0.9, top_p=0.95, seed=5,
                               stop=[tok.eos_id]))
    assert s.choices[0].text == tok.decode(want, skip_special_tokens=True)


def test_special_tokens_never_in_reply_text(client):
    """The demo samples its BOS (<s>, a document boundary in its training text) as the third
    token of this reply: the token counts, its text is left out (as transformers'
    skip_special_tokens and llama.cpp leave it out); the stop token </s> ends a reply."""
    kw = dict(model="demo", messages=[{"role": "user", "content": "def read_config(path):"}],
              max_tokens=10, temperature=1.0, seed=7)
    r = client.chat.completions.create(**kw, logprobs=True)
    tokens = [e.token for e in r.choices[0].logprobs.content]
    assert "<s>" in tokens  # sampled: else this test checks nothing
    text = r.choices[0].message.content
    assert "<s>" not in text and text
    chunks = client.chat.completions.create(**kw, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text


def test_stop_tokens_include_generation_config_eos():
    """generation_config.json's eos_token_id (GLM-4.5 lists three) ends a reply too."""
    from moepack.runtime.tokenizer import Tokenizer, generation_eos_ids
    from moepack.serve.vocab import Vocab
    from serve_fixtures import demo_container

    path = str(demo_container())
    assert generation_eos_ids(path) == [1]  # the demo's </s>
    tok = Tokenizer.from_container(path)
    assert Vocab(tok, 8192, [1, 7, 9999]).stop_ids == {1, 4, 7}  # </s>, <|im_end|>, 7


def test_chat_nonstream_and_stream_agree(client):
    msgs = [{"role": "user", "content": "import os"}]
    whole = client.chat.completions.create(model="demo", messages=msgs, max_tokens=64,
                                           temperature=0)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    text = whole.choices[0].message.content
    chunks = list(client.chat.completions.create(model="demo", messages=msgs, max_tokens=64,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == whole.choices[0].finish_reason and set(finals[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        whole.usage.completion_tokens
    # The server sends whatever text is ready as one chunk; 64 tokens (not 16) keep a loaded
    # machine from delivering them all at once.
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1


def test_stream_wire_format_ends_with_done(srv):
    body = json.dumps({"model": "demo", "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                       "stream": True}).encode()
    req = urllib.request.Request(srv.url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    for e in events[:-1]:
        assert e.startswith("data: {")
        obj = json.loads(e[len("data: "):])
        assert obj["object"] == "text_completion"


def test_stop_strings_across_tokens_not_emitted(client):
    full = client.completions.create(model="demo", prompt=PROMPT, max_tokens=24,
                                     temperature=0).choices[0].text
    # a stop string that starts inside one token and ends in a later one
    tok_texts = []
    stream = client.completions.create(model="demo", prompt=PROMPT, max_tokens=24,
                                       temperature=0, stream=True)
    for c in stream:
        if c.choices and c.choices[0].text:
            tok_texts.append(c.choices[0].text)
    joined = "".join(tok_texts)
    assert joined == full
    i = next(i for i in range(1, len(tok_texts)) if tok_texts[i])
    start = len("".join(tok_texts[:i])) - 1  # last char of one piece + first of the next
    stop = full[start:start + 2]
    r = client.completions.create(model="demo", prompt=PROMPT, max_tokens=24, temperature=0,
                                  stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[:full.index(stop)]
    s = client.completions.create(model="demo", prompt=PROMPT, max_tokens=24, temperature=0,
                                  stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == full[:full.index(stop)]


def test_logprobs(client):
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=5, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert 1 <= len(content) <= 5
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob)
        assert [t.logprob for t in e.top_logprobs] == sorted(
            (t.logprob for t in e.top_logprobs), reverse=True)
    c = client.completions.create(model="demo", prompt=PROMPT, max_tokens=4, temperature=0,
                                  logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0


def test_seed_and_temperature(client):
    kw = dict(model="demo", prompt=PROMPT, max_tokens=16, temperature=1.2, top_p=0.95)
    a = client.completions.create(seed=7, **kw).choices[0].text
    b = client.completions.create(seed=7, **kw).choices[0].text
    others = {client.completions.create(seed=s, **kw).choices[0].text for s in range(8, 12)}
    assert a == b
    assert len(others | {a}) > 1


def test_max_completion_tokens(client):
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "a"}],
                                       max_completion_tokens=3, temperature=0)
    assert r.usage.completion_tokens <= 3


def test_prefix_reuse_second_turn_processes_only_new_tokens(srv, client):
    msgs = [{"role": "user", "content": "class Config:"}]
    r1 = client.chat.completions.create(model="demo", messages=msgs, max_tokens=12,
                                        temperature=0)
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "def load(self):"}]
    r2 = client.chat.completions.create(model="demo", messages=msgs, max_tokens=12,
                                        temperature=0)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    # everything of turn 1 that went into the KV cache: its prompt and the reply's tokens but
    # the last (sampled, never fed)
    assert cached >= r1.usage.prompt_tokens + r1.usage.completion_tokens - 1
    evaluated = r2.model_extra["moepack_stats"]["prompt_tokens_evaluated"]
    assert evaluated == r2.usage.prompt_tokens - cached
    assert evaluated < r2.usage.prompt_tokens / 2
    m = srv.metrics()
    assert m["moepack_prompt_tokens_cached_total"] >= cached


def test_async_client_stream_and_not(srv):
    async def main() -> tuple[str, str]:
        c = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        r = await c.completions.create(model="demo", prompt=PROMPT, max_tokens=10,
                                       temperature=0)
        s = await c.completions.create(model="demo", prompt=PROMPT, max_tokens=10,
                                       temperature=0, stream=True)
        parts = [ch.choices[0].text async for ch in s if ch.choices]
        await c.close()
        return r.choices[0].text, "".join(parts)

    whole, streamed = asyncio.run(main())
    assert whole and whole == streamed


def test_eight_concurrent_clients_all_answered_in_order(srv, client):
    prompts = [f"def f{i}(x):" for i in range(8)]
    want = [client.completions.create(model="demo", prompt=p, max_tokens=20,
                                      temperature=0).choices[0].text for p in prompts]

    async def one(c, i: int, done: list) -> str:
        await asyncio.sleep(0.05 * i)  # staggered arrival: the queue is first come first served
        r = await c.completions.create(model="demo", prompt=prompts[i], max_tokens=20,
                                       temperature=0)
        done.append(i)
        return r.choices[0].text

    async def main() -> tuple[list[str], list[int]]:
        c = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                               timeout=120)
        done: list[int] = []
        got = await asyncio.gather(*(one(c, i, done) for i in range(8)))
        await c.close()
        return got, done

    got, order = asyncio.run(main())
    assert got == want  # each answer is its own prompt's: nothing lost or crossed
    assert order == sorted(order)


def test_metrics_prometheus_text(srv, client):
    client.completions.create(model="demo", prompt=PROMPT, max_tokens=4, temperature=0)
    with urllib.request.urlopen(srv.url + "/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    for name in ("decode_tokens_per_second", "queue_depth", "expert_cache_hits_total",
                 "bytes_read_total", "io_wait_seconds_total", "completion_tokens_total"):
        assert f"# TYPE moepack_{name} " in text
    m = srv.metrics()
    assert m["moepack_completion_tokens_total"] >= 4
    assert m["moepack_decode_tokens_per_second"] > 0
    assert m['moepack_requests_total{endpoint="/v1/completions",status="200"}'] >= 1
    assert m["moepack_queue_depth"] == 0


def test_time_to_first_token_reported(client):
    t0 = time.monotonic()
    r = client.completions.create(model="demo", prompt=PROMPT, max_tokens=4, temperature=0)
    ttft = r.model_extra["moepack_stats"]["time_to_first_token"]
    assert 0 < ttft < time.monotonic() - t0
    assert "tok/s" in r.model_extra["moepack_stats"]["line"]
