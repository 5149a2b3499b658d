"""logit_bias, presence_penalty and frequency_penalty on `moepack serve` (OpenAI's semantics),
checked against the engine's raw logits: greedy and sampled, streamed and not, with seeds,
under JSON mode, and refused with the right param when bad."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from serve_fixtures import demo_container
from test_serve_errors import assert_error, post

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
PROMPT = "def read_config(path):"  # greedy, the demo repeats itself: "get_path.get_path..."
N = 24


@pytest.fixture(scope="module")
def model():
    """The demo's tokenizer, the prompt's ids, the stop ids and an engine on the container."""
    from moepack.runtime.engine import Engine
    from moepack.runtime.tokenizer import Tokenizer, generation_eos_ids, stop_ids

    path = str(demo_container())
    tok = Tokenizer.from_container(path)
    with Engine(path, threads=1) as e:
        yield tok, tok.encode_prompt(PROMPT), stop_ids(tok, e.vocab_size,
                                                       generation_eos_ids(path)), e


def greedy(e, ids: list[int], n: int, stop: set[int], presence: float = 0.0,
           frequency: float = 0.0, bias: dict[int, float] | None = None) -> list[int]:
    """Greedy decoding with OpenAI's formula written out here, on the engine's raw logits."""
    e.reset()
    logits, out = e.feed(ids), []
    for _ in range(n):
        row = logits.copy()
        for t, b in (bias or {}).items():
            row[t] += np.float32(b)
        for t, c in Counter(out).items():
            row[t] -= np.float32(presence) + np.float32(frequency) * np.float32(c)
        out.append(int(np.argmax(row)))  # ties: the lowest id, as the C sampler
        if out[-1] in stop:
            break
        logits = e.feed(out[-1:])
    return out


def text(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=True)


def complete(client, stream: bool = False, **kw) -> str:
    args = {"model": "demo", "prompt": PROMPT, "max_tokens": N, "temperature": 0, **kw}
    if stream:
        return "".join(c.choices[0].text for c in client.completions.create(**args,
                                                                            stream=True))
    return client.completions.create(**args).choices[0].text


@pytest.mark.parametrize("stream", [False, True])
def test_negative_bias_removes_the_greedy_token(client, model, stream):
    tok, ids, stop, e = model
    e.reset()
    first, second = np.argsort(-e.feed(ids))[:2].tolist()
    got = complete(client, stream, max_tokens=1, logit_bias={str(first): -100})
    assert got == text(tok, [second]) != text(tok, [first])


def test_positive_bias_forces_a_token_even_sampled(client, model):
    tok = model[0]
    hello = tok.encode(" hello", add_special_tokens=False)[0]
    got = complete(client, temperature=1.0, seed=3, max_tokens=5, logit_bias={str(hello): 100})
    assert got == text(tok, [hello] * 5)


def test_the_json_mask_wins_over_a_positive_bias(client, model):
    """+100 on " he" cannot start the object (the grammar forbids it there), and takes every
    step once a string is open (it may stand there); -100 on a newline moves the greedy reply
    off the newlines it gives unbiased."""
    tok = model[0]
    he, nl = (tok.encode(t, add_special_tokens=False)[0] for t in (" hello", "\n"))
    assert tok.decode([he]) == " he"

    def reply(bias: dict) -> str:
        return client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=12,
            temperature=0, response_format={"type": "json_object"},
            logit_bias=bias).choices[0].message.content

    assert reply({}) == "{" + "\n" * 11
    biased = reply({str(he): 100, str(nl): -100})
    assert biased.startswith('{') and biased.endswith('"' + " he" * 9), biased


@pytest.mark.parametrize("stream", [False, True])
def test_frequency_penalty_breaks_the_repetition_where_predicted(client, model, stream):
    tok, ids, stop, e = model
    plain = greedy(e, ids, N, stop)
    want = greedy(e, ids, N, stop, frequency=1.0)
    k = next(i for i, (a, b) in enumerate(zip(plain, want, strict=False)) if a != b)
    assert plain[k] in plain[:k]  # it diverges where greedy would repeat a token
    assert complete(client) == text(tok, plain)
    assert complete(client, stream, frequency_penalty=1.0) == text(tok, want)


def test_presence_penalty_and_bias_together(client, model):
    tok, ids, stop, e = model
    bias = {ids[-1]: -5.0}
    want = greedy(e, ids, N, stop, presence=1.5, frequency=0.25, bias=bias)
    assert want != greedy(e, ids, N, stop)
    got = complete(client, presence_penalty=1.5, frequency_penalty=0.25,
                   logit_bias={str(k): v for k, v in bias.items()})
    assert got == text(tok, want)


def test_seed_reproducible_with_penalties_and_as_moepack_run(client, model):
    tok, ids, stop, e = model
    kw = dict(temperature=0.9, seed=11, presence_penalty=0.5, frequency_penalty=0.7)
    a, b = complete(client, **kw), complete(client, True, **kw)
    assert a == b and a != complete(client, temperature=0.9, seed=11)
    e.reset()
    want = list(e.generate(ids, N, temperature=0.9, seed=11, stop=sorted(stop),
                           presence_penalty=0.5, frequency_penalty=0.7))
    assert a == text(tok, want)
    # the CLI shares the engine's code: the same tokens
    run = subprocess.run([sys.executable, "-m", "moepack", "run", str(demo_container()), PROMPT,
                          "-n", str(N), "--temp", "0.9", "--seed", "11", "--threads", "1",
                          "--presence-penalty", "0.5", "--frequency-penalty", "0.7", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert json.loads(run.stdout)["tokens"] == want


CHAT = "/v1/chat/completions"


def _body(**kw) -> str:
    return json.dumps({"model": "demo", "messages": [{"role": "user", "content": "x"}],
                       "max_tokens": 2, **kw})


@pytest.mark.parametrize("body,param,says", [
    (_body(logit_bias={"8192": 1}), "logit_bias", "not in 0..8191"),
    (_body(logit_bias={"5": 101}), "logit_bias", "from -100 to 100"),
    (_body(logit_bias={"5": -100.5}), "logit_bias", "from -100 to 100"),
    (_body(logit_bias={"5": "1"}), "logit_bias", "from -100 to 100"),
    (_body(logit_bias={"5": True}), "logit_bias", "from -100 to 100"),
    (_body(logit_bias={"abc": 1}), "logit_bias", "decimal strings"),
    (_body(logit_bias={"-1": 1}), "logit_bias", "decimal strings"),
    (_body(logit_bias={"05": 1}), "logit_bias", "decimal strings"),
    (_body(logit_bias={"9" * 5000: 1}), "logit_bias", "decimal strings"),
    (_body(logit_bias={str(i): 1 for i in range(301)}), "logit_bias", "at most 300"),
    (_body(logit_bias=[1, 2]), "logit_bias", "an object"),
    (_body()[:-1] + ', "logit_bias": {"5": NaN}}', "logit_bias", "finite"),
    (_body()[:-1] + ', "logit_bias": {"5": Infinity}}', "logit_bias", "finite"),
    (_body(presence_penalty=2.5), "presence_penalty", "from -2 to 2"),
    (_body()[:-1] + ', "frequency_penalty": NaN}', "frequency_penalty", "from -2 to 2"),
    (_body(frequency_penalty="1"), "frequency_penalty", "from -2 to 2"),
])
def test_bad_bias_and_penalties_are_400_with_the_param(srv, body, param, says):
    for path, b in ((CHAT, body), ("/v1/completions", body.replace(
            '"messages": [{"role": "user", "content": "x"}]', '"prompt": "x"'))):
        status, obj, _ = post(srv, path, b)
        assert_error(status, obj, 400)
        assert obj["error"]["param"] == param and says in obj["error"]["message"], obj


def test_the_largest_accepted_bias_is_served(srv):
    body = _body(logit_bias={str(i): (-1) ** i * 100 for i in range(300)},
                 presence_penalty=-2, frequency_penalty=2)
    status, obj, _ = post(srv, CHAT, body)
    assert status == 200, obj
