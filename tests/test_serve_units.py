"""Pieces of `moepack serve` without a server: the JSON recognizer against json.loads, token
masks, stop strings, tool-call parsing, and Engine.truncate (the KV prefix reuse it rests on)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moepack.serve import grammar, tools
from moepack.serve.constraint import Chain, Choice, Forced, JsonObject
from moepack.serve.grammar import JsonMasker, TokenTrie
from moepack.serve.job import Done, Piece
from moepack.serve.responses import ChatOutput, ChatResponder
from moepack.serve.stops import StopMatcher

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) |
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids,
                                                              max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=5), _json_values, max_size=4),
       st.sampled_from([None, 0, 2]), st.booleans())
def test_recognizer_accepts_every_json_object(obj, indent, ascii_only):
    text = json.dumps(obj, indent=indent, ensure_ascii=ascii_only)
    st_ = grammar.walk(grammar.START, text)
    assert st_ is not None and grammar.done(st_)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='{}[]":,.-+eE0123456789tfnrulasdx? \\\n', max_size=24))
def test_recognizer_agrees_with_json_loads(text):
    st_ = grammar.walk(grammar.START, text)
    try:
        # the grammar takes one object and nothing around it (test_recognizer_rejects: ' {}',
        # '{"a":1} '), which json.loads allows
        ok = isinstance(json.loads(text), dict) and text[:1] == "{" and text[-1:] == "}" and \
            text.count("\n") + text.count(" ") <= grammar.MAX_WS
    except ValueError:
        ok = False
    if ok:
        assert st_ is not None and grammar.done(st_)
    if st_ is not None and grammar.done(st_):
        assert isinstance(json.loads(text), dict)


def test_recognizer_rejects():
    for bad in ['[1]', ' {}', '{"a":01}', '{"a" 1}', '{"a":1,}', '{"a":tru}', '{"a":"\x01"}',
                '{"a":"\\x"}', '{"a":1}}', '{"a":1} ', '{' + '"a":{' * 40, '{"a":5d2}',
                '{"a":1.5d}', '{"a":-d}', '{"a":1e+d}']:
        s = grammar.walk(grammar.START, bad)
        assert s is None or not grammar.done(s), bad


def test_the_mask_cache_is_bounded_in_bytes_too():
    """A mask inside a string holds nearly the whole vocabulary: 512 of them for a 152k-token
    vocabulary were ~600 MB at int64. The cache keeps at most cache_bytes (one mask at least)."""
    texts = ["a", "b", '"', "{", "}", ":", ",", " ", "1", "x"] * 50
    masker = JsonMasker(TokenTrie(texts), cache_bytes=3000)
    states, st = [], grammar.START
    for ch in '{"abc": "xyz", "k": 11':
        st = grammar.step(st, ch)
        assert st is not None
        states.append(st)
    for s in states:
        ids = masker.allowed(s)
        assert ids.dtype == np.int32
    assert 0 < masker.nbytes <= 3000


def test_token_mask_keeps_output_valid():
    texts = ['{', '}', '"', 'a', '":', ' 1', '1,', 'true', '{"', '"}', ',"', None, '[', ']',
             'x"', ': "']
    masker = JsonMasker(TokenTrie(texts))
    rng = np.random.default_rng(0)
    for _ in range(50):
        con, out = JsonObject(masker), ""
        for _ in range(40):
            allowed = con.allowed()
            assert allowed.size and all(texts[i] is not None for i in allowed)
            tid = int(rng.choice(allowed))
            out += texts[tid]
            con.advance(tid)
            assert grammar.walk(grammar.START, out) is not None
            if con.done:
                assert isinstance(json.loads(out), dict)
                break


def test_forced_choice_chain():
    texts = ["<call>", "get", "_", "weather", "time", '"', "get_time", " {", "}"]
    trie = TokenTrie(texts)
    con = Chain([Forced([0]), Choice(trie, ['get_weather"', 'get_time"'])])
    assert con.forced() == 0
    con.advance(0)
    assert con.forced() is None
    first = {texts[i] for i in con.allowed()}
    assert first == {"get", "get_time"}
    con.advance(texts.index("get_time"))
    assert {texts[i] for i in con.allowed()} == {'"'}
    con.advance(texts.index('"'))
    assert con.done


@pytest.mark.parametrize("pieces,stops,want,stopped", [
    (["hel", "lo E", "N", "D more"], ["END"], "hello ", True),
    (["ab", "c"], ["bc"], "a", True),
    (["x", "a", "b"], ["abc"], "xab", False),  # held back, then let out at the end
    (["no stops here"], [], "no stops here", False),
    (["a\n", "\nb"], ["\n\n"], "a", True),
])
def test_stop_matcher(pieces, stops, want, stopped):
    m = StopMatcher(stops)
    out = "".join(m.push(p) for p in pieces)
    assert m.stopped == stopped
    assert out + m.flush() == want


def test_hermes_parse_and_split():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' \
           '\n</tool_call>\n<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'
    content, calls = tools.parse(tools.HERMES, text, {"get_weather"})
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather",
                                                                   {"city": "Paris"})]
    split = tools.MarkerSplit("<tool_call>")
    out = "".join(split.push(text[i:i + 3]) for i in range(0, len(text), 3))
    assert out == "Let me check.\n" and split.hit
    assert tools.parse(tools.HERMES, "<tool_call>{not json}</tool_call>", {"f"}) == (
        "<tool_call>{not json}</tool_call>", [])


def test_deepseek_parse_both_forms():
    before, _, mid, after = tools.forced_parts(tools.DEEPSEEK, ["f"])
    v3 = "ok" + before + "f\n" + mid + '{"a": [1, 2]}' + after
    assert tools.parse(tools.DEEPSEEK, v3, {"f"})[1][0].arguments == '{"a": [1, 2]}'
    v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"b\": 1}<｜tool▁call▁end｜>"
    content, calls = tools.parse(tools.DEEPSEEK, v31, {"f"})
    assert content == "" and calls[0].name == "f"
    assert tools.family("{% if tools %}<tool_call>{% endif %}") == tools.HERMES
    assert tools.family("<｜tool▁call▁begin｜>") == tools.DEEPSEEK
    assert tools.family("{{ messages }}") is None


def test_engine_truncate_reuses_prefix_bit_identically():
    from moepack.runtime.engine import Engine
    from serve_fixtures import demo_container

    a, b = list(range(10, 40)), list(range(10, 25)) + [77, 78, 79]
    with Engine(str(demo_container()), threads=1) as e:
        e.feed(a)
        e.truncate(15)
        assert e.position == 15
        e.truncate(99)  # past the end: nothing changes
        assert e.position == 15
        x = e.feed(b[15:])
        y = e.logits(b)[-1]
    np.testing.assert_array_equal(x, y)


def _obj(chunk: dict | bytes) -> dict:
    """Content chunks come pre-serialized (bytes); the rest as dicts."""
    return json.loads(chunk) if isinstance(chunk, bytes) else chunk


def _done(text: str, finish: str = "stop") -> Done:
    stats = {k: 0 for k in ("prompt_tokens", "decode_tokens", "prompt_seconds",
                            "decode_seconds", "cache_hits", "cache_misses", "bytes_read",
                            "io_wait_seconds", "hit_rate", "prompt_tok_s", "decode_tok_s",
                            "io_wait_share")}
    return Done(finish, 5, 0, 9, text, {**stats, "o_direct": False}, 0.1, 0.01)


def test_auto_tool_call_stream_holds_back_the_call():
    """A reply that starts as text and turns into a <tool_call>: the text streams as content,
    the call comes out as a tool_calls delta, finish_reason tool_calls."""
    text = 'Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n' \
           '</tool_call>'
    pieces = [Piece(text[i:i + 4], i) for i in range(0, len(text), 4)]
    r = ChatResponder("m", ChatOutput(tools.HERMES, ["get_weather"], False), False)
    chunks = [_obj(c) for p in pieces if (c := r.piece_chunk([p]))]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert content == "Checking."
    finals = r.final_chunks(_done(text), include_usage=True)
    (call,) = finals[0]["choices"][0]["delta"]["tool_calls"]
    assert call["index"] == 0 and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert finals[1]["choices"][0]["finish_reason"] == "tool_calls"
    assert finals[2]["choices"] == [] and finals[2]["usage"]["total_tokens"] == 14
    whole = ChatResponder("m", ChatOutput(tools.HERMES, ["get_weather"], False), False).whole(
        pieces, _done(text))
    msg = whole["choices"][0]["message"]
    assert msg["content"] == "Checking." and msg["tool_calls"][0]["type"] == "function"
    assert whole["choices"][0]["finish_reason"] == "tool_calls"


def test_text_that_only_looks_like_a_marker_is_content():
    text = "a <tool_ca b"
    r = ChatResponder("m", ChatOutput(tools.HERMES, ["f"], False), False)
    streamed = "".join(_obj(c)["choices"][0]["delta"].get("content", "")
                       for c in [r.piece_chunk([Piece(ch, 0)]) for ch in text] if c)
    finals = r.final_chunks(_done(text, "length"), include_usage=False)
    streamed += finals[0]["choices"][0]["delta"].get("content", "")
    assert streamed == text and finals[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("fam", [tools.HERMES, tools.DEEPSEEK, tools.KIMI, tools.MISTRAL])
def test_forced_call_text_parses_back(fam):
    """What a forced call writes (prefix, name, arguments, suffix) is what parse reads."""
    before, options, mid, after = tools.forced_parts(fam, ["get_weather", "get_time"])
    text = "Sure. " + before + options[1] + mid + '{"city": "Oslo", "n": [1, 2.5]}' + after
    content, calls = tools.parse(fam, text, {"get_weather", "get_time"})
    assert content == "Sure."
    (call,) = calls
    assert call.name == "get_time" and json.loads(call.arguments) == {"city": "Oslo",
                                                                      "n": [1, 2.5]}
    cid = call.as_openai()["id"]
    if fam == tools.KIMI:
        assert cid == "functions.get_time:0"
    elif fam == tools.MISTRAL:
        assert len(cid) == 9 and cid.isalnum()
    else:
        assert cid.startswith("call_")


def test_kimi_and_mistral_templates_detected_and_parsed():
    assert tools.family("{{ '<|tool_calls_section_begin|>' }}") == tools.KIMI
    assert tools.family("{{ '[TOOL_CALLS]' }}") == tools.MISTRAL
    kimi = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_"
            'begin|>{"a": 1}<|tool_call_end|><|tool_call_begin|>functions.g:1<|tool_call_'
            'argument_begin|>{"b": 2}<|tool_call_end|><|tool_calls_section_end|>')
    _, calls = tools.parse(tools.KIMI, kimi, {"f", "g"})
    assert [(c.name, c.as_openai()["id"]) for c in calls] == [("f", "functions.f:0"),
                                                              ("g", "functions.g:1")]
    mistral = '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "x", ' \
              '"arguments": {}}]'
    _, calls = tools.parse(tools.MISTRAL, mistral, {"f"})
    assert [c.name for c in calls] == ["f"]
    assert tools.parse(tools.MISTRAL, "[TOOL_CALLS] [{oops", {"f"})[1] == []
