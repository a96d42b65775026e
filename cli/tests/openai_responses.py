#!/usr/bin/env python3
"""The official `openai` client against `runtime serve`'s Responses API (run by
serve_responses.rs's `openai_python_client_responses`), through the client's own types.

With `tools` (a server whose chat template teaches tool calls): `responses.create` for text,
`responses.stream` (the events in order, the final text equal to the non-streamed answer at
temperature 0), `responses.parse` with a Pydantic model as `text_format`, a forced tool call
whose arguments are valid, sent back with its output and answered; Codex CLI's tools (a
namespace, web search); refusals as the client's typed exceptions.

With `reasoning` (a server whose template opens the answer's `<think>` section): the answer
as a reasoning item, streamed as `reasoning_text` deltas, and sent back in the next turn.

usage: openai_responses.py BASE_URL API_KEY tools|reasoning
"""
import json
import sys

import openai
import pydantic

base_url, api_key, mode = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
model = client.models.list().data[0].id
question = "What is the capital of France?"


def stream_events(**request):
    """`responses.stream`: the events' types, the text and reasoning deltas joined, and the
    final response (the client's, parsed, when completed; `response.incomplete`'s, which the
    client leaves to the caller, when cut short), checking the numbering."""
    kinds, deltas, reasoning = [], [], []
    with client.responses.stream(**request) as stream:
        for event in stream:
            assert event.sequence_number == len(kinds), (event, kinds)
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
                assert event.snapshot.endswith(event.delta), event
            if event.type == "response.reasoning_text.delta":
                reasoning.append(event.delta)
        if event.type == "response.completed":
            final = stream.get_final_response()
        else:
            assert event.type == "response.incomplete", kinds
            final = event.response
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    return kinds, "".join(deltas), "".join(reasoning), final


def text():
    """Text: whole, streamed, parsed into a Pydantic model; refusals."""
    asked = dict(model=model, input=question, instructions="Answer in one sentence.",
                 temperature=0, max_output_tokens=24, metadata={"run": "client"})
    whole = client.responses.create(**asked)
    assert whole.object == "response" and whole.id.startswith("resp_"), whole
    assert whole.status in ("completed", "incomplete"), whole
    assert whole.metadata == {"run": "client"} and whole.store is False, whole
    assert whole.output_text and "Paris" in whole.output_text, whole
    [message] = whole.output
    assert message.type == "message" and message.content[0].type == "output_text", whole
    usage = whole.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens, usage
    assert usage.output_tokens <= 24 and usage.output_tokens_details.reasoning_tokens == 0, usage

    kinds, streamed, _, final = stream_events(**asked)
    assert streamed == whole.output_text, (streamed, whole.output_text)
    assert final.output_text == whole.output_text, final
    assert final.usage.output_tokens == usage.output_tokens, final
    expected = ["response.created", "response.in_progress", "response.output_item.added",
                "response.content_part.added"]
    assert kinds[:4] == expected, kinds
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", f"response.{whole.status}"], kinds
    assert set(kinds[4:-4]) == {"response.output_text.delta"}, kinds

    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        country: str = pydantic.Field(max_length=20)
        capital: bool

    parsed = client.responses.parse(model=model, input="Describe Paris as JSON.",
                                    text_format=City, temperature=0, max_output_tokens=80)
    assert parsed.status == "completed", parsed
    city = parsed.output_parsed
    assert isinstance(city, City), parsed
    assert City.model_validate_json(parsed.output_text) == city, parsed

    for bad, param in [(dict(previous_response_id="resp_1"), "previous_response_id"),
                       (dict(tool_choice="required"), "tool_choice"),
                       (dict(include=["message.output_text.logprobs"]), "include"),
                       (dict(extra_body={"colour": 1}), None)]:
        try:
            client.responses.create(model=model, input=question, max_output_tokens=2, **bad)
            raise AssertionError(f"{bad} was accepted")
        except openai.BadRequestError as e:
            assert e.param == param, (bad, e)
    try:
        openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).responses.create(
            model=model, input=question, max_output_tokens=2)
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError:
        pass


def check(value, schema, where="arguments"):
    """`value` valid against `schema`, for the keywords the tool below uses (a hand check:
    CI installs only the openai package); where jsonschema is installed, the whole schema."""
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
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(value, schema)


def tool_calls():
    """A forced call, its arguments valid and parsed by the client (a strict tool), streamed
    alike, sent back with its output and answered."""
    weather = {"type": "object", "properties": {
        "location": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 16}},
            "required": ["city"], "additionalProperties": False},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["location", "unit"], "additionalProperties": False}
    tools = [{"type": "function", "name": "get_weather", "strict": True,
              "description": "The weather forecast for a city.", "parameters": weather}]
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    forced = dict(model=model, input=ask, tools=tools, tool_choice="required",
                  parallel_tool_calls=False, temperature=0, max_output_tokens=80)
    whole = client.responses.create(**forced)
    assert whole.status == "completed", whole
    [call] = whole.output
    assert call.type == "function_call" and call.name == "get_weather", whole
    assert call.call_id and call.id.startswith("fc_"), call
    check(json.loads(call.arguments), weather)

    kinds, _, _, final = stream_events(**forced)
    [streamed] = final.output
    assert (streamed.name, streamed.arguments) == (call.name, call.arguments), (streamed, call)
    assert streamed.parsed_arguments == json.loads(call.arguments), streamed
    assert "response.function_call_arguments.delta" in kinds, kinds

    named = client.responses.create(**dict(forced, tool_choice={"type": "function",
                                                                "name": "get_weather"}))
    assert named.output[0].name == "get_weather", named

    # The output sent back as the client has it, with the call's output: answered.
    output = {"type": "function_call_output", "call_id": call.call_id,
              "output": json.dumps({"temperature": 21, "sky": "sunny"})}
    answer = client.responses.create(model=model, input=ask + whole.output + [output],
                                     tools=tools, temperature=0, max_output_tokens=8)
    assert answer.output, answer
    assert answer.usage.input_tokens > whole.usage.input_tokens + 20, (answer, whole)
    assert answer.usage.input_tokens_details.cached_tokens > 0, answer

    # As Codex CLI asks: a function inside a namespace, OpenAI's web search beside it (not
    # offered: this server runs none), encrypted reasoning asked for, the client's metadata.
    # The call comes back in its namespace, and is read back by the next request.
    codex = dict(model=model, input=ask, temperature=0, max_output_tokens=80,
                 tools=[{"type": "namespace", "name": "forecasts", "description": "Forecasts.",
                         "tools": [dict(tools[0], strict=False)]},
                        {"type": "web_search", "external_web_access": False}],
                 tool_choice={"type": "function", "name": "get_weather"},
                 include=["reasoning.encrypted_content"],
                 extra_body={"client_metadata": {"session_id": "s1"}})
    spaced = client.responses.create(**codex)
    [call] = spaced.output
    assert (call.name, call.namespace) == ("get_weather", "forecasts"), spaced
    check(json.loads(call.arguments), weather)
    output = dict(output, call_id=call.call_id)
    again = client.responses.create(**dict(codex, input=ask + spaced.output + [output],
                                           tool_choice="auto", max_output_tokens=8))
    assert again.status in ("completed", "incomplete"), again


def reasoning():
    """The answer as a reasoning item (the template opened it), whole and streamed, then
    sent back in the next turn."""
    asked = dict(model=model, input=question, temperature=0, max_output_tokens=12,
                 reasoning={"effort": "high"})
    whole = client.responses.create(**asked)
    [item] = whole.output
    assert item.type == "reasoning" and item.id.startswith("rs_"), whole
    assert item.content[0].type == "reasoning_text" and item.content[0].text.strip(), item
    assert whole.status == "incomplete", whole
    assert whole.incomplete_details.reason == "max_output_tokens", whole
    assert whole.usage.output_tokens_details.reasoning_tokens > 0, whole.usage

    kinds, _, streamed, final = stream_events(**asked)
    assert streamed == item.content[0].text, (streamed, item)
    assert final.output[0].content[0].text == item.content[0].text, final
    assert final.usage.output_tokens == whole.usage.output_tokens, (final, whole)
    assert "response.reasoning_text.done" in kinds, kinds

    again = client.responses.create(model=model, temperature=0, max_output_tokens=2,
                                    input=[{"role": "user", "content": question}, *whole.output,
                                           {"role": "user", "content": "And of Italy?"}])
    assert again.usage.input_tokens > whole.usage.input_tokens, (again, whole)


if mode == "tools":
    text()
    tool_calls()
elif mode == "reasoning":
    reasoning()
else:
    sys.exit(f"unknown mode {mode!r}")
print("ok")
