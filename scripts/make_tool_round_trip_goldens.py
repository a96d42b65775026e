#!/usr/bin/env python3
"""Makes runtime/tests/data/chat-tools/round_trips.json: conversations that used a tool, as an
OpenAI client sends them back (an assistant message whose `tool_calls` hold their arguments
as a string of JSON, then the `tool` message with the result), and what Hugging Face
transformers renders for them with the Qwen2.5, Qwen3 and Llama 3.2 templates in
runtime/tests/data/chat-tools/.

transformers' templates expect a call's arguments as the object, not its string (its chat
templating docs: passing the string "may cause errors or strange model behaviour"; given the
string, `tojson` prints it quoted). So, as vLLM does before rendering
(vllm/entrypoints/chat_utils.py, `_postprocess_messages`), each string is read with Python's
`json.loads` (an empty one is `{}`), then the conversation goes to
`tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
tokenize=False)`. The arguments are chosen where a reader other than `json.loads` differs:
integers past 64 and 128 bits, `-0`, a float past f64's range, a repeated key, escapes.

Setup (no torch needed):
    python3 -m venv /tmp/tmpl-venv
    /tmp/tmpl-venv/bin/pip install transformers jinja2 tokenizers
    /tmp/tmpl-venv/bin/python scripts/make_tool_round_trip_goldens.py

Our side (server/src/api.rs `tool_round_trips_render_as_transformers_does`, and
runtime/tests/chat_tools.rs) reads the same OpenAI messages and must render these texts
byte for byte.
"""

import copy
import json
import platform
import sys
from pathlib import Path

import jinja2
import transformers
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "runtime" / "tests" / "data" / "chat-tools"
OUT = DATA / "round_trips.json"

TEMPLATES = {
    "qwen2.5-instruct.jinja": ("tiny-qwen2", None, "<|im_end|>", {}),
    "qwen3.jinja": ("tiny-qwen2", None, "<|im_end|>", {}),
    # A fixed date: otherwise the template writes today's.
    "llama3.2-instruct.jinja": ("tiny-llama3", "<|begin_of_text|>", "<|eot_id|>",
                                {"date_string": "26 Jul 2024"}),
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}

# The arguments strings, exactly as a client sends them back (raw JSON text).
ARGUMENTS = {
    # What this server returns: compact JSON, as OpenAI's API writes it.
    "compact": '{"city":"Paris","unit":"celsius"}',
    "spaced": '{"city": "Paris", "unit": "celsius"}',
    "big_integers": (
        '{"id":98765432109876543210987654321,"past_u64":18446744073709551616,'
        '"u64":18446744073709551615,"below_i64":-9223372036854775809,'
        '"past_i128":1234567890123456789012345678901234567890123,'
        '"negative_past_i128":-1234567890123456789012345678901234567890123}'
    ),
    "special_numbers": (
        '{"minus_zero":-0,"minus_zero_float":-0.0,"past_f64":1E400,"exponent":1.0e5,'
        '"subnormal":5e-324,"small":1.5e-7,"integer_exponent":1e2,"neg":-2.50}'
    ),
    "repeated_key": '{"a":1,"b":[true,null],"a":{"c":"d"}}',
    "escapes": r'{"s":"caf\u00e9 \ud83d\ude00 <b>&amp;</b> \"q\" \\ \/ \n\t","u":"\u0000\u001f\u007f"}',
    "nested": '{"matrix":[[1,2],[3,4.5]],"deep":{"a":{"b":{"c":[]}}},"empty":{}}',
    "empty_string": "",
}


def conversation(arguments, content):
    return [
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "sunny"}'},
    ]


def as_vllm_renders(messages):
    """The messages as vLLM hands them to the template: each call's arguments read with
    `json.loads` (empty: `{}`), and, as transformers 5 does anyway, None values left out."""
    messages = copy.deepcopy(messages)
    for message in messages:
        for call in message.get("tool_calls") or []:
            text = call["function"]["arguments"]
            call["function"]["arguments"] = json.loads(text) if text else {}
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def make_tokenizer(fixture, bos, eos, template):
    path = ROOT / "converter" / "tests" / "data" / fixture / "tokenizer.json"
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
    tok.chat_template = template
    if bos is not None:
        tok.bos_token = bos
    tok.eos_token = eos
    return tok


def main():
    cases = []
    for template_name, (fixture, bos, eos, kwargs) in TEMPLATES.items():
        template = (DATA / template_name).read_text(encoding="utf-8")
        tok = make_tokenizer(fixture, bos, eos, template)
        for name, arguments in ARGUMENTS.items():
            # Qwen3's template reads an assistant message's content: "" (OpenAI's clients
            # may send either; Qwen2.5 and Llama get null, which transformers leaves out).
            content = "" if template_name == "qwen3.jinja" else None
            messages = conversation(arguments, content)
            text = tok.apply_chat_template(
                as_vllm_renders(messages),
                tools=[copy.deepcopy(WEATHER)],
                add_generation_prompt=True,
                tokenize=False,
                **kwargs,
            )
            cases.append({
                "name": f"{template_name.removesuffix('.jinja')}/{name}",
                "template": template_name,
                "bos_token": bos,
                "eos_token": eos,
                "kwargs": kwargs,
                "messages": messages,
                "tools": [WEATHER],
                "text": text,
            })
    out = {
        "made_by": {
            "transformers": transformers.__version__,
            "jinja2": jinja2.__version__,
            "python": platform.python_version(),
            "script": "scripts/make_tool_round_trip_goldens.py",
        },
        "cases": cases,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(cases)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
