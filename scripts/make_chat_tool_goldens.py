#!/usr/bin/env python3
"""Makes runtime/tests/data/chat-tools/renders.json: what Hugging Face transformers'
`tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=True,
tokenize=False, **kwargs)` renders for the chat templates in runtime/tests/data/chat-tools/,
over conversations with and without tool calls. Our minijinja renderer must match these
byte for byte.

Setup (no torch needed):
    python3 -m venv /tmp/tmpl-venv
    /tmp/tmpl-venv/bin/pip install transformers jinja2 tokenizers
    /tmp/tmpl-venv/bin/python scripts/make_chat_tool_goldens.py

Each case is written with the exact inputs used: messages, tools, bos/eos token strings
(null = not set on the tokenizer, so not passed to the template at all) and extra template
kwargs. The inputs are round-tripped through JSON before rendering, so what is rendered is
exactly what a reader of renders.json sees (key order included: `tojson` prints dicts in
insertion order). A case whose template raises records `error` (the exception text) and
`text: null`.
"""

import copy
import datetime
import json
import platform
import sys
from pathlib import Path

import jinja2
import transformers
from transformers import PreTrainedTokenizerFast
from transformers.utils import chat_template_utils

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "runtime" / "tests" / "data" / "chat-tools"
OUT = DATA / "renders.json"

TEMPLATES = {
    "qwen2.5-instruct.jinja": {
        "tokenizer_json": ROOT / "converter/tests/data/tiny-qwen2/tokenizer.json",
        "bos_token": None,  # Qwen2.5's tokenizer_config.json has "bos_token": null
        "eos_token": "<|im_end|>",
        "kwargs": {},
    },
    "qwen3.jinja": {
        "tokenizer_json": ROOT / "converter/tests/data/tiny-qwen2/tokenizer.json",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "kwargs": {},
    },
    "llama3.2-instruct.jinja": {
        "tokenizer_json": ROOT / "converter/tests/data/tiny-llama3/tokenizer.json",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        # Otherwise the template calls strftime_now("%d %b %Y") and the render depends on today.
        "kwargs": {"date_string": "26 Jul 2024"},
    },
    # Templates without tools: only the cases that name them (`only_for`) and GENERAL_CASES.
    "gemma3.jinja": {
        "tokenizer_json": ROOT / "converter/tests/data/tiny-llama3/tokenizer.json",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "kwargs": {},
        "tools": False,
    },
    "smollm3.jinja": {
        "tokenizer_json": ROOT / "converter/tests/data/tiny-qwen2/tokenizer.json",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "kwargs": {},
        "tools": False,
    },
}

# The cases without tools that the templates without tools get too.
GENERAL_CASES = {"no_tools_with_system", "no_tools_no_system_multi_turn"}

# `strftime_now` sees this fixed day, so no render depends on the day it is made (none of the
# cases here writes the date: Llama's get `date_string`).
TODAY = (2025, 7, 8)
SMOLLM3 = {"smollm3.jinja"}
GEMMA3 = {"gemma3.jinja"}


# ---------------------------------------------------------------------------------------------
# Message / tool builders (exactly the JSON shape our Rust structs serialize to)


def system(content):
    return {"role": "system", "content": content}


def user(content):
    return {"role": "user", "content": content}


def assistant(content):
    return {"role": "assistant", "content": content}


def call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_calls(*calls, content=None):
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def tool_result(call_id, content):
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def tool(name, description, parameters):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


GET_WEATHER = tool(
    "get_weather",
    "Get the current weather for a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
)

GET_TIME = tool(
    "get_time",
    "Get the local time in an IANA timezone.",
    {
        "type": "object",
        "properties": {"timezone": {"type": "string", "description": "e.g. Europe/Paris"}},
        "required": ["timezone"],
    },
)

# Keys deliberately out of alphabetical order at every level; nested objects/arrays/enums;
# non-ASCII, HTML-ish and quote characters, backslashes, newlines and a tab in strings;
# floats, a u64-sized integer, booleans and nulls; an empty `properties`.
SEARCH_CATALOG = tool(
    "search_catalog",
    "Find <items> & \"things\" in the 'catalog'.\nPaths look like C:\\shop\\items (backslashes).\n"
    "\tCafé, 日本, 🚀 — all welcome.",
    {
        "type": "object",
        "required": ["query", "zeta"],
        "properties": {
            "zeta": {"type": "number", "minimum": 0.5, "maximum": 1.0, "multipleOf": 1e-07, "default": 1.0},
            "query": {"type": "string", "description": "Free text; may contain \"quotes\" and \\escapes\\."},
            "alpha": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": -1.5, "maximum": 12345678901234567890},
                        "tags": {"type": "array", "items": {"type": "string", "enum": ["new", "sale", "日本"]}},
                    },
                },
            },
            "mode": {"enum": ["fast", "exact", None, True, 1], "description": "Search mode 🚀"},
            "filters": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "in_stock": {"type": "boolean", "default": True},
                    "note": {"type": ["string", "null"], "default": None},
                    "budget": {"type": "number", "maximum": 1e16},
                },
            },
            "options": {"type": "object", "properties": {}},
        },
    },
)

PING = tool("ping", "Check that the service is alive.", {})

CALL_WEATHER = call("call_weather_1", "get_weather", {"city": "Paris", "unit": "celsius"})
CALL_TIME = call("call_time_1", "get_time", {"timezone": "Europe/Paris"})

CATALOG_ARGS = {
    "query": "<b>\"café\" & 'crème'</b>\nline2 \\ back",
    "zeta": 0.5,
    "alpha": [{"id": 12345678901234567890, "tags": ["日本", "sale"]}],
    "filters": {"in_stock": True, "note": None, "budget": 1.0},
    "mode": "exact",
    "emoji": "🚀",
}
CATALOG_RESULT = json.dumps(
    {"results": [{"name": "Café au lait ☕", "price": 3.5, "tags": ["日本"]}], "total": 1, "next": None},
    ensure_ascii=False,
)


def scenarios():
    """(name, messages, tools, extra kwargs, only_for) — rendered for every template unless only_for."""
    return [
        ("single_tool", [user("What's the weather in Paris?")], [GET_WEATHER], {}, None),
        (
            "system_two_tools",
            [system("You are a helpful travel assistant."), user("What's the weather and time in Paris?")],
            [GET_WEATHER, GET_TIME],
            {},
            None,
        ),
        (
            "no_tools_with_system",
            [system("You are a terse assistant."), user("Say hi.")],
            None,
            {},
            None,
        ),
        (
            "no_tools_no_system_multi_turn",
            [user("Hello!"), assistant("Hi! How can I help?"), user("Tell me a joke.")],
            None,
            {},
            None,
        ),
        (
            "empty_tools_list",
            [user("What's the weather in Paris?")],
            [],
            {},
            None,
        ),
        (
            "round_trip",
            [
                user("What's the weather in Paris?"),
                assistant_calls(CALL_WEATHER),
                tool_result("call_weather_1", "22°C and sunny"),
                assistant("It's 22°C and sunny in Paris."),
                user("And what time is it there?"),
            ],
            [GET_WEATHER, GET_TIME],
            {},
            None,
        ),
        (
            "parallel_calls",
            [
                user("What's the weather and time in Paris?"),
                assistant_calls(CALL_WEATHER, CALL_TIME),
                tool_result("call_weather_1", "22°C and sunny"),
                tool_result("call_time_1", "14:05"),
            ],
            [GET_WEATHER, GET_TIME],
            {},
            None,
        ),
        (
            "tricky_schema",
            [system("Système: réponds en français. <ok> & \"fine\""), user("Trouve du café 日本 🚀 pour moi.")],
            [SEARCH_CATALOG, PING],
            {},
            None,
        ),
        (
            "tricky_args_json_tool_content",
            [
                user("Find café in the catalog."),
                assistant_calls(call("call_cat_1", "search_catalog", CATALOG_ARGS)),
                tool_result("call_cat_1", CATALOG_RESULT),
            ],
            [SEARCH_CATALOG],
            {},
            None,
        ),
        (
            "empty_arguments",
            [
                user("Is the service up?"),
                assistant_calls(call("call_ping_1", "ping", {})),
                tool_result("call_ping_1", "pong"),
            ],
            [PING],
            {},
            None,
        ),
        (
            "call_with_content",
            [
                user("What's the weather in Paris?"),
                assistant_calls(CALL_WEATHER, content="Let me check that for you."),
                tool_result("call_weather_1", "22°C and sunny"),
            ],
            [GET_WEATHER],
            {},
            None,
        ),
        (
            "whitespace_in_content",
            [
                system("  You are helpful.\n\n"),
                user("\n  What's the weather in Paris?  \n"),
                assistant_calls(CALL_WEATHER),
                tool_result("call_weather_1", "  22°C\nand sunny \n"),
                assistant("\nIt's sunny.  "),
                user("  Thanks!\n"),
            ],
            [GET_WEATHER],
            {},
            None,
        ),
        (
            "system_only_with_tools",
            [system("You are a helpful assistant.")],
            [GET_WEATHER],
            {},
            None,
        ),
        (
            "tools_in_system_message",
            [system("You are a helpful travel assistant."), user("What's the weather in Paris?")],
            [GET_WEATHER, GET_TIME],
            {"tools_in_user_message": False},
            {"llama3.2-instruct.jinja"},
        ),
        (
            "tools_in_system_message_round_trip",
            [
                user("What's the weather in Paris?"),
                assistant_calls(CALL_WEATHER),
                tool_result("call_weather_1", "22°C and sunny"),
            ],
            [GET_WEATHER],
            {"tools_in_user_message": False},
            {"llama3.2-instruct.jinja"},
        ),
        # Qwen3: thinking switched by `enable_thinking`; earlier turns' <think> sections
        # dropped from the history (Python string methods in the template).
        ("thinking_off", [user("Hi there")], None, {"enable_thinking": False}, {"qwen3.jinja"}),
        ("thinking_on", [user("Hi there")], None, {"enable_thinking": True}, {"qwen3.jinja"}),
        (
            "history_with_thinking",
            [
                system("Be brief."),
                user("What is 2 + 2?"),
                assistant("<think>\nTwo and two make four.\n</think>\n\n4."),
                user("And 3 + 3?"),
            ],
            None,
            {},
            {"qwen3.jinja"},
        ),
        (
            "thinking_then_call_then_result",
            [
                user("What's the weather in Paris?"),
                assistant_calls(CALL_WEATHER, content="<think>\nI should call the tool.\n</think>\n\n"),
                tool_result("call_weather_1", "22°C and sunny"),
            ],
            [GET_WEATHER],
            {"enable_thinking": True},
            {"qwen3.jinja"},
        ),
        (
            "user_message_that_is_a_tool_response",
            [user("Start"), assistant("Ok."), user("<tool_response>\nx\n</tool_response>")],
            None,
            {},
            {"qwen3.jinja"},
        ),
        # SmolLM3: thinking on unless `enable_thinking` is false or the system prompt says
        # `/no_think` (`/think` there wins over the flag), the flags cut out of the custom
        # instructions; history answers keep their <think> sections in think mode and get an
        # empty one in no-think mode; a tool result is a user turn.
        ("thinking_default", [user("Hi there")], None, {}, SMOLLM3 | {"qwen3.jinja"}),
        ("thinking_off", [user("Hi there")], None, {"enable_thinking": False}, SMOLLM3),
        ("thinking_on", [user("Hi there")], None, {"enable_thinking": True}, SMOLLM3),
        ("system_no_think", [system("Be brief. /no_think"), user("Hi")], None, {}, SMOLLM3),
        ("system_think_beats_flag", [system("/think Be brief.  "), user("Hi")], None,
         {"enable_thinking": False}, SMOLLM3),
        ("system_only_flag", [system("/no_think"), user("Hi")], None, {}, SMOLLM3),
        ("system_override", [system("You are a pirate. /system_override"), user("Hi")], None, {}, SMOLLM3),
        (
            "history_think",
            [system("Be brief."), user("What is 2 + 2?"),
             assistant("\n<think>\nTwo and two make four.\n</think>\n4."), user("And 3 + 3?")],
            None, {}, SMOLLM3,
        ),
        (
            "history_no_think",
            [user("What is 2 + 2?"), assistant("\n\n4."), user("And 3 + 3?")],
            None, {"enable_thinking": False}, SMOLLM3,
        ),
        (
            "tool_message_as_user",
            [user("Weather?"), assistant("Checking."), tool_result("call_1", "22°C"), user("Thanks")],
            None, {}, SMOLLM3,
        ),
        # Gemma 3: the system prompt is folded into the first user turn, `assistant` is
        # `model`, contents trimmed, roles must alternate.
        ("system_folded", [system("You are terse."), user("  Hi!  "), assistant(" Hello. "), user("Bye\n")],
         None, {}, GEMMA3),
        ("no_system", [user("Hi!")], None, {}, GEMMA3),
        ("roles_must_alternate", [user("Hi!"), user("Again")], None, {}, GEMMA3),
        ("assistant_first", [system("Be brief."), assistant("Hello.")], None, {}, GEMMA3),
    ]


def make_tokenizer(spec, template_text):
    tok = PreTrainedTokenizerFast(tokenizer_file=str(spec["tokenizer_json"]))
    tok.chat_template = template_text
    if spec["bos_token"] is not None:
        tok.bos_token = spec["bos_token"]
    tok.eos_token = spec["eos_token"]
    # apply_chat_template passes tok.special_tokens_map (only the tokens that are set) into the
    # template context; make sure that is exactly bos/eos as recorded.
    expected = {k: spec[k] for k in ("bos_token", "eos_token") if spec[k] is not None}
    assert tok.special_tokens_map == expected, tok.special_tokens_map
    return tok


class FixedDay(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(*TODAY, 12, 0, 0)


def main():
    # transformers' `strftime_now` reads `datetime.now()` of this module.
    chat_template_utils.datetime = FixedDay
    cases = []
    for template_name, spec in TEMPLATES.items():
        template_text = (DATA / template_name).read_text(encoding="utf-8")
        tok = make_tokenizer(spec, template_text)
        for name, messages, tools, extra, only_for in scenarios():
            if only_for is not None and template_name not in only_for:
                continue
            if only_for is None and not spec.get("tools", True) and name not in GENERAL_CASES:
                continue
            kwargs = {**spec["kwargs"], **extra}
            # Round-trip through JSON so the render sees exactly what renders.json holds.
            messages = json.loads(json.dumps(messages, ensure_ascii=False))
            tools = json.loads(json.dumps(tools, ensure_ascii=False))
            text, error = None, None
            try:
                text = tok.apply_chat_template(
                    copy.deepcopy(messages),
                    tools=copy.deepcopy(tools),
                    add_generation_prompt=True,
                    tokenize=False,
                    **copy.deepcopy(kwargs),
                )
                assert isinstance(text, str)
            except jinja2.exceptions.TemplateError as e:
                error = str(e)
            cases.append(
                {
                    "name": f"{template_name.removesuffix('.jinja')}/{name}",
                    "template": template_name,
                    "bos_token": spec["bos_token"],
                    "eos_token": spec["eos_token"],
                    "messages": messages,
                    "tools": tools,
                    "kwargs": kwargs,
                    "text": text,
                    "error": error,
                }
            )

    out = {
        "made_by": {
            "transformers": transformers.__version__,
            "jinja2": jinja2.__version__,
            "python": platform.python_version(),
            "script": "scripts/make_chat_tool_goldens.py",
        },
        "cases": cases,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(c["error"] is not None for c in cases)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(cases)} cases ({n_err} errors)", file=sys.stderr)


if __name__ == "__main__":
    main()
