#!/usr/bin/env python3
"""The official `anthropic` client against `runtime serve`'s Messages API (run by
serve_messages.rs's `anthropic_python_client`, the server's chat template teaching tool calls):
`messages.create` with a system prompt (a string and text blocks alike), stop sequences, a
forced tool call (`tool_choice: any`) whose input is valid, sent back with its `tool_result`
and answered; `messages.stream` (text equal to the non-streamed answer, a call's input joined
from its `input_json_delta` pieces); `messages.count_tokens`; refusals as the client's typed
exceptions.

With `thinking` (against a server whose template opens the answer's `<think>` section): the
answer as a thinking block, streamed as `thinking_delta`s, and sent back in the next turn.

usage: anthropic_client.py BASE_URL API_KEY [thinking]
"""
import json
import re
import sys

import urllib.request

import anthropic

base_url, api_key = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0)
# The served model's name, from the list OpenAI's clients read.
listed = urllib.request.Request(f"{base_url}/v1/models", headers={"x-api-key": api_key})
model = json.load(urllib.request.urlopen(listed))["data"][0]["id"]
ask = [{"role": "user", "content": "What is the capital of France?"}]
# Greedy: the 2.x clients have no `temperature` argument (the API still takes the field).
GREEDY = {"extra_body": {"temperature": 0}}


def text(message):
    return "".join(block.text for block in message.content if block.type == "text")


def prompt_tokens(usage):
    """The prompt's length: the tokens read from a cache and the others, as Anthropic counts."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


def check(value, schema, where="input"):
    """`value` valid against `schema`, for the keywords the tool below uses (a hand check: CI
    installs only the anthropic package)."""
    if "enum" in schema:
        assert value in schema["enum"], (where, value, schema)
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict), (where, value)
        for key in schema.get("required", []):
            assert key in value, (where, key, value)
        properties = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(properties), (where, value)
        for key, item in value.items():
            if key in properties:
                check(item, properties[key], f"{where}.{key}")
    elif kind == "string":
        assert isinstance(value, str), (where, value)
        assert schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value))
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), (where, value)
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value)


def plain():
    """Text: whole, streamed, cut by a stop sequence, counted; refusals."""
    system = "You are a helpful assistant."
    asked = dict(model=model, system=system, messages=ask, max_tokens=24, **GREEDY)
    whole = client.messages.create(**asked)
    assert (whole.type, whole.role, whole.model) == ("message", "assistant", model), whole
    assert whole.id.startswith("msg_"), whole
    assert whole.stop_reason in ("end_turn", "max_tokens"), whole
    answer = text(whole)
    assert "Paris" in answer, whole
    blocks = client.messages.create(**dict(asked, system=[{"type": "text", "text": system}]))
    assert text(blocks) == answer, (blocks, whole)

    with client.messages.stream(**asked) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == answer, (pieces, answer)
    assert text(final) == answer and final.stop_reason == whole.stop_reason, (final, whole)
    assert final.usage.output_tokens == whole.usage.output_tokens, (final, whole)
    assert prompt_tokens(final.usage) == prompt_tokens(whole.usage), (final, whole)

    # Cut where the answer's third word begins.
    word = answer[[m.start() for m in re.finditer(" ", answer)][1]:][:4]
    stopped = client.messages.create(**asked, stop_sequences=["never written here", word])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word), stopped
    assert text(stopped) == answer[:answer.index(word)], (stopped, answer)

    counted = client.messages.count_tokens(model=model, system=system, messages=ask)
    assert counted.input_tokens == prompt_tokens(whole.usage), (counted, whole.usage)

    for kwargs, error, kind in [
        ({"model": "no-such-model"}, anthropic.NotFoundError, "not_found_error"),
        ({"extra_body": {"temperature": 1.5}}, anthropic.BadRequestError, "invalid_request_error"),
        ({"messages": ask + [{"role": "assistant", "content": "The"}]}, anthropic.BadRequestError,
         "invalid_request_error"),
    ]:
        try:
            client.messages.create(**dict(asked, **kwargs))
            raise AssertionError(f"{kwargs} was accepted")
        except error as e:
            assert e.body["type"] == "error" and e.body["error"]["type"] == kind, e.body
    try:
        wrong = anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0)
        wrong.messages.create(**asked)
        raise AssertionError("a wrong key was accepted")
    except anthropic.AuthenticationError as e:
        assert e.body["error"]["type"] == "authentication_error", e.body


def tools():
    """A forced call made, streamed and answered through the client's types."""
    weather = {"type": "object", "properties": {
        "location": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 16}},
            "required": ["city"], "additionalProperties": False},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["location", "unit"], "additionalProperties": False}
    offered = [{"name": "get_weather", "description": "The weather forecast for a city.",
                "input_schema": weather}]
    question = [{"role": "user", "content": "What's the weather in Paris?"}]
    forced = dict(model=model, messages=question, tools=offered, max_tokens=80, **GREEDY,
                  tool_choice={"type": "any", "disable_parallel_tool_use": True})
    whole = client.messages.create(**forced)
    assert whole.stop_reason == "tool_use", whole
    calls = [block for block in whole.content if block.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather", whole
    assert calls[0].id.startswith("toolu_"), whole
    check(calls[0].input, weather)

    # The answer's content sent back as the client has it, with the tool's result: answered.
    result = {"type": "tool_result", "tool_use_id": calls[0].id,
              "content": json.dumps({"temperature": 21, "sky": "sunny"})}
    turns = question + [{"role": "assistant", "content": whole.content},
                        {"role": "user", "content": [result]}]
    answer = client.messages.create(model=model, messages=turns, tools=offered, max_tokens=8,
                                    **GREEDY)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use"), answer
    assert prompt_tokens(answer.usage) > prompt_tokens(whole.usage) + 20, (answer, whole)
    counted = client.messages.count_tokens(model=model, messages=turns, tools=offered)
    assert counted.input_tokens == prompt_tokens(answer.usage), (counted, answer.usage)

    # Streamed: the input_json_delta pieces join to the same input.
    pieces, names = [], []
    with client.messages.stream(**forced) as stream:
        for event in stream:
            names.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                pieces.append(event.delta.partial_json)
        final = stream.get_final_message()
    assert names[0] == "message_start" and names[-1] == "message_stop", names
    assert pieces and json.loads("".join(pieces)) == calls[0].input, (pieces, calls)
    streamed = [block for block in final.content if block.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed] == [(c.name, c.input) for c in calls], final
    assert final.stop_reason == "tool_use", final


def thinking():
    """Reasoning as a thinking block, whole and streamed, and sent back."""
    asked = dict(model=model, messages=ask, max_tokens=12, **GREEDY,
                 thinking={"type": "enabled", "budget_tokens": 1024})
    whole = client.messages.create(**asked)
    assert [block.type for block in whole.content] == ["thinking"], whole
    block = whole.content[0]
    assert block.thinking.strip() and block.signature == "", block
    with client.messages.stream(**asked) as stream:
        streamed = "".join(event.delta.thinking for event in stream
                           if event.type == "content_block_delta"
                           and event.delta.type == "thinking_delta")
        final = stream.get_final_message()
    assert streamed == block.thinking, (streamed, block)
    assert final.content[0].thinking == block.thinking, final
    turns = ask + [{"role": "assistant", "content": whole.content},
                   {"role": "user", "content": "And of Italy?"}]
    follow = client.messages.create(**dict(asked, messages=turns, max_tokens=4))
    assert prompt_tokens(follow.usage) > prompt_tokens(whole.usage), (follow, whole)


if sys.argv[3:] == ["thinking"]:
    thinking()
    print("anthropic client thinking: ok")
else:
    plain()
    tools()
    print("anthropic client: ok")
