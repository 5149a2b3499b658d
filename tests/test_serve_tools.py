"""Tool calls and JSON mode through `moepack serve` with the openai client: a container whose
chat template takes tools (Qwen2.5's, Hermes-style) for the round trip; the demo's ChatML
template refuses tools with a 400."""

from __future__ import annotations

import json

import openai
import pytest
from serve_fixtures import HERMES_TEMPLATE, ServerProcess, demo_server, tools_container

pytestmark = [pytest.mark.network, pytest.mark.timeout(240)]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tools_srv():
    s = ServerProcess(tools_container(HERMES_TEMPLATE))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(tools_srv):
    return openai.OpenAI(base_url=tools_srv.url + "/v1", api_key="x", max_retries=0, timeout=60)


def _named_call(client):
    """Sampled: the tiny model may ramble inside the arguments until max_tokens; the forced name
    is always the one asked for, and the first seed that finishes the call is returned."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(6):
        r = client.chat.completions.create(model="demo", messages=ASK, tools=[WEATHER, TIME],
                                           max_tokens=200, temperature=0.7, seed=seed,
                                           tool_choice=named)
        ch = r.choices[0]
        if ch.finish_reason == "tool_calls":
            return r, ch
        assert ch.finish_reason == "length" and r.usage.completion_tokens == 200
        assert ch.message.content.startswith('<tool_call>\n{"name": "get_weather", '
                                             '"arguments": {')
    pytest.fail("no seed finished the forced call")


def test_named_tool_choice_round_trip(client):
    r, ch = _named_call(client)
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("call_")
    assert isinstance(json.loads(call.function.arguments), dict)
    # the tool's answer goes back; the template renders it and the model replies
    follow = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'}]
    r2 = client.chat.completions.create(model="demo", messages=follow, tools=[WEATHER, TIME],
                                        max_tokens=8, temperature=0)
    assert r2.choices[0].message.role == "assistant"
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens
    # the rendered tool call and response are in the prompt: the turn reuses turn 1's cache
    assert r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens


def test_required_tool_choice_picks_a_listed_function(client):
    """Sampled: the tiny model may ramble inside an argument string until max_tokens; the call
    is still one of the listed functions, and most seeds finish it."""
    finished = 0
    for seed in range(6):
        r = client.chat.completions.create(model="demo", messages=ASK, tools=[WEATHER, TIME],
                                           tool_choice="required", max_tokens=300,
                                           temperature=1.0, seed=seed)
        ch = r.choices[0]
        if ch.finish_reason == "tool_calls":
            (call,) = ch.message.tool_calls
            assert call.function.name in {"get_weather", "get_time"}
            assert isinstance(json.loads(call.function.arguments), dict)
            finished += 1
        else:
            assert ch.finish_reason == "length" and r.usage.completion_tokens == 300
            assert ch.message.content.startswith(('<tool_call>\n{"name": "get_weather", '
                                                  '"arguments": {', '<tool_call>\n{"name": '
                                                  '"get_time", "arguments": {'))
    assert finished >= 1


def test_streamed_tool_call(client):
    stream = client.chat.completions.create(
        model="demo", messages=ASK, tools=[WEATHER], stream=True, max_tokens=200,
        temperature=0, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls, finish = {}, None
    for c in stream:
        if not c.choices:
            continue
        for tc in c.choices[0].delta.tool_calls or []:
            d = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            d["name"] += tc.function.name or ""
            d["arguments"] += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather" and isinstance(json.loads(calls[0]["arguments"]),
                                                             dict)


def test_auto_tool_choice_answers(client):
    """The tiny model does not choose to call tools on its own; auto still answers, and the
    parser is covered by test_serve_units."""
    r = client.chat.completions.create(model="demo", messages=ASK, tools=[WEATHER],
                                       max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_unknown_named_tool_is_400(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="demo", messages=ASK, tools=[WEATHER], max_tokens=8,
            tool_choice={"type": "function", "function": {"name": "nope"}})


def test_template_without_tools_refuses_them():
    c = openai.OpenAI(base_url=demo_server().url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="demo", messages=ASK, tools=[WEATHER], max_tokens=4)
    assert "does not take tools" in str(e.value)
    # tool_choice "none": the tools are not used, so nothing to refuse
    r = c.chat.completions.create(model="demo", messages=ASK, tools=[WEATHER],
                                  tool_choice="none", max_tokens=4, temperature=0)
    assert r.choices[0].message.tool_calls is None


def test_json_object_mode_is_valid_json():
    from moepack.serve import grammar

    c = openai.OpenAI(base_url=demo_server().url + "/v1", api_key="x", max_retries=0,
                      timeout=60)
    msgs = [{"role": "user", "content": "hi"}]
    r = c.chat.completions.create(model="demo", messages=msgs, max_tokens=300, temperature=0,
                                  response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"  # closed the object before max_tokens
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    msgs = [{"role": "user", "content": "Describe a config file as JSON."}]
    for seed in range(4):  # sampled: the object may run past max_tokens, but never goes wrong
        r = c.chat.completions.create(model="demo", messages=msgs, max_tokens=60,
                                      temperature=1.0, seed=seed,
                                      response_format={"type": "json_object"})
        ch = r.choices[0]
        assert grammar.walk(grammar.START, ch.message.content) is not None, ch
        if ch.finish_reason == "stop":
            assert isinstance(json.loads(ch.message.content), dict)
        else:
            assert ch.finish_reason == "length" and r.usage.completion_tokens == 60


def test_json_object_mode_streamed():
    c = openai.OpenAI(base_url=demo_server().url + "/v1", api_key="x", max_retries=0)
    s = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "{"}],
                                  max_tokens=300, temperature=0, stream=True,
                                  response_format={"type": "json_object"})
    text = "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
    assert isinstance(json.loads(text), dict)
