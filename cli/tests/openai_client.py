#!/usr/bin/env python3
"""The official `openai` client against `runtime serve` (run by serve.rs's
`openai_python_client`): chat and completions, plain and streamed, logprobs, the model list,
and a refused request raising the client's typed error.

With `tools` (run by serve_tools.rs's `openai_python_client_calls_tools`, against a server
whose chat template teaches tool calls): a forced tool call whose arguments are valid, sent
back with its result and answered, and the same call streamed.

usage: openai_client.py BASE_URL API_KEY [tools]
"""
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import openai

base_url, api_key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
messages = [{"role": "user", "content": "What is the capital of France?"}]

models = client.models.list()
model = models.data[0].id


def check(value, schema, where="arguments"):
    """`value` valid against `schema`, for the keywords the tools below use (a hand check:
    CI installs only the openai package)."""
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
    elif kind == "array":
        assert isinstance(value, list), (where, value)
        assert schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value))
        for i, item in enumerate(value):
            check(item, schema["items"], f"{where}[{i}]")
    elif kind == "string":
        assert isinstance(value, str), (where, value)
        assert schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value))
        if "pattern" in schema:
            assert re.search(schema["pattern"], value), (where, value)
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), (where, value)
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value)
    try:
        import jsonschema  # where it is installed, the whole schema checked too
    except ImportError:
        return
    jsonschema.validate(value, schema)


def tool_calls():
    """A forced call made and answered through the client's types, then streamed."""
    weather = {"type": "object", "properties": {
        "location": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 16}},
            "required": ["city"], "additionalProperties": False},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["location", "unit"], "additionalProperties": False}
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather forecast for a city.",
        "parameters": weather}}]
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    forced = dict(model=model, messages=ask, tools=tools, tool_choice="required",
                  parallel_tool_calls=False, temperature=0, max_tokens=80)
    whole = client.chat.completions.create(**forced)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", whole
    assert choice.message.content is None, whole
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1, whole
    for call in calls:
        assert call.type == "function" and call.id, call
        assert call.function.name == "get_weather", call
        check(json.loads(call.function.arguments), weather)

    # The answer's message sent back as the client has it (the README's round trip), then
    # the same as plain dicts, with the tool's result: answered.
    results = [{"role": "tool", "tool_call_id": call.id,
                "content": json.dumps({"temperature": 21, "sky": "sunny"})} for call in calls]
    sent = {"role": "assistant", "content": None,
            "tool_calls": [call.model_dump(exclude_none=True) for call in calls]}
    for turn in (choice.message, sent):
        answer = client.chat.completions.create(model=model, messages=ask + [turn] + results,
                                                tools=tools, temperature=0, max_tokens=8)
        message = answer.choices[0].message
        assert message.content is not None or message.tool_calls, answer
        assert answer.usage.prompt_tokens > whole.usage.prompt_tokens + 20, (answer, whole)
    # A call whose arguments are not JSON: the client's typed error, naming messages.
    broken = dict(sent, tool_calls=[dict(sent["tool_calls"][0], function={
        "name": "get_weather", "arguments": "{\"location\""})])
    try:
        client.chat.completions.create(model=model, messages=ask + [broken] + results,
                                       tools=tools, max_tokens=8)
        raise AssertionError("arguments that are not JSON were accepted")
    except openai.BadRequestError as e:
        assert e.param == "messages", e

    # Streamed: the deltas, joined by index, are the same call.
    streamed, finish, roles, content = {}, None, [], []
    for chunk in client.chat.completions.create(**forced, stream=True):
        for delta_choice in chunk.choices:
            delta = delta_choice.delta
            roles.append(delta.role)
            if delta.content:
                content.append(delta.content)
            for call in delta.tool_calls or []:
                if call.index not in streamed:
                    assert call.id, chunk
                    streamed[call.index] = {"id": call.id, "name": "", "arguments": ""}
                else:
                    assert not call.id, chunk
                if call.function and call.function.name:
                    streamed[call.index]["name"] += call.function.name
                if call.function and call.function.arguments:
                    streamed[call.index]["arguments"] += call.function.arguments
            if delta_choice.finish_reason is not None:
                finish = delta_choice.finish_reason
    assert roles[0] == "assistant", roles
    assert finish == "tool_calls", finish
    assert not content, content
    assert sorted(streamed) == list(range(len(calls))), streamed
    assert [(streamed[i]["name"], streamed[i]["arguments"]) for i in sorted(streamed)] == \
        [(call.function.name, call.function.arguments) for call in calls], (streamed, calls)


if sys.argv[3:] == ["tools"]:
    tool_calls()
    print("openai client tools: ok")
    sys.exit(0)

whole = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                       max_tokens=20, seed=1)
answer = whole.choices[0].message.content
assert whole.choices[0].finish_reason in ("stop", "length"), whole
assert "Paris" in answer, answer
assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

pieces, usage = [], None
stream = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                        max_tokens=20, stream=True,
                                        stream_options={"include_usage": True})
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
assert "".join(pieces) == answer, (pieces, answer)
assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens

completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8,
                                       temperature=0)
assert completion.choices[0].text, completion
streamed = "".join(c.choices[0].text for c in client.completions.create(
    model=model, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True)
    if c.choices)
assert streamed == completion.choices[0].text, (streamed, completion.choices[0].text)

# Log-probabilities, read through the client's types.
scored = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                        max_tokens=6, logprobs=True, top_logprobs=2)
tokens = scored.choices[0].logprobs.content
assert len(tokens) == scored.usage.completion_tokens, tokens
assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in tokens), tokens
assert "".join(t.token for t in tokens) == scored.choices[0].message.content

# Each token's bytes are its own, also for part of a character: together, the answer's.
japanese = [{"role": "user", "content": "Write the word 'sun' in Japanese."}]
scored = client.chat.completions.create(model=model, messages=japanese, temperature=0,
                                        max_tokens=12, logprobs=True)
tokens = scored.choices[0].logprobs.content
assert b"".join(bytes(t.bytes) for t in tokens) == scored.choices[0].message.content.encode()
# Streamed, each chunk carries its text's tokens.
for chunk in client.chat.completions.create(model=model, messages=japanese, temperature=0,
                                            max_tokens=12, logprobs=True, stream=True):
    for choice in chunk.choices:
        if choice.delta.content:
            pieces = b"".join(bytes(t.bytes) for t in choice.logprobs.content)
            assert pieces == choice.delta.content.encode(), chunk

# Several prompts, a choice each.
several = client.completions.create(model=model, prompt=["Once upon a time", "Hello"],
                                    max_tokens=4, temperature=0)
assert [c.index for c in several.choices] == [0, 1], several

# Fields OpenAI's API accepts: a salt for the kept caches. Tools, even not to be called, are
# refused naming `tools` when the model's chat template cannot show them (SmolLM2's).
client.chat.completions.create(model=model, messages=messages, max_tokens=2,
                               extra_body={"cache_salt": "tenant-a"})
tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
try:
    client.chat.completions.create(model=model, messages=messages, max_tokens=2, tools=tools,
                                   tool_choice="none")
    raise AssertionError("tools the template cannot show were accepted")
except openai.BadRequestError as e:
    assert e.param == "tools", e

# Errors as OpenAI's: the field at fault and the code.
for kwargs, error, param, code in [
    ({"max_tokens": 0}, openai.BadRequestError, "max_tokens", None),
    ({"messages": [{"role": "user", "content": "word " * 9000}]}, openai.BadRequestError,
     "messages", "context_length_exceeded"),
    ({"model": "gpt-4"}, openai.NotFoundError, "model", "model_not_found"),
]:
    try:
        client.chat.completions.create(**{"model": model, "messages": messages, **kwargs})
        raise AssertionError(f"{kwargs} was accepted")
    except error as e:
        assert (e.param, e.code) == (param, code), e

# The same seed gives the same sampled text.
sampled = [client.chat.completions.create(model=model, messages=messages, temperature=0.9,
                                          max_tokens=16, seed=42).choices[0].message.content
           for _ in range(2)]
assert sampled[0] == sampled[1], sampled

# Four clients at once, each getting its own answer.
with ThreadPoolExecutor(4) as pool:
    answers = list(pool.map(lambda _: client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=20).choices[0].message.content,
        range(4)))
assert answers == [answer] * 4, answers

# n choices, each the one n=1 gives with the seed plus its index; the penalties and
# logit_bias are accepted as the client sends them (the bias: keys as strings).
several = client.chat.completions.create(model=model, messages=messages, n=2, seed=7,
                                         temperature=0.9, max_tokens=12)
assert [c.index for c in several.choices] == [0, 1], several
for j, choice in enumerate(several.choices):
    alone = client.chat.completions.create(model=model, messages=messages, seed=7 + j,
                                           temperature=0.9, max_tokens=12)
    assert choice.message.content == alone.choices[0].message.content, (j, several, alone)
biased = client.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                        temperature=0, presence_penalty=0.5,
                                        frequency_penalty=1.0, logit_bias={198: -100})
assert "\n" not in biased.choices[0].message.content, biased

# Structured outputs: the client sends the pydantic model as a strict json_schema and
# parses the answer back into it.
from typing import Literal
import pydantic

class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: Literal["France", "Italy", "Spain"]
    population: int = pydantic.Field(ge=0, le=100_000_000)

parsed = client.chat.completions.parse(
    model=model, messages=[{"role": "user", "content": "Tell me about Paris."}],
    response_format=City, max_tokens=80, temperature=0)
city = parsed.choices[0].message.parsed
assert isinstance(city, City), parsed

try:
    openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError:
    pass

print("openai client: ok")
