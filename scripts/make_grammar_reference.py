#!/usr/bin/env python3
"""Makes converter/tests/data/grammar-reference.json: what Python llguidance and transformers
do under a grammar on the tiny random checkpoints, for converter/tests/grammar.rs to hold the
runtime's constrained decoding (runtime/src/text/grammar.rs, on the llguidance Rust crate) to.

usage: ~/.cache/oracle-venv/bin/python scripts/make_grammar_reference.py \
           converter/tests/data/grammar-reference.json

needs: torch, transformers, tokenizers, safetensors, numpy and llguidance (the version the
Rust crate is, 1.9.1) in the venv:
    python3 -m venv ~/.cache/oracle-venv
    ~/.cache/oracle-venv/bin/pip install torch transformers tokenizers safetensors numpy \
        llguidance==1.9.1

For each checkpoint (tiny-llama3, tiny-qwen2) and grammar (GRAMMARS below) a case holds:
- `end_ids`: the checkpoint's generation_config.json `eos_token_id` (as a list), all passed
  to llguidance as its end-of-sequence tokens; `vocab_size`: config.json's, the mask's length.
- `grammar`: {"kind": "json_schema" | "lark" | "regex", "source": ...}, the schema without
  the `x-guidance` key the runtime adds (and this script adds the same way:
  {"whitespace_pattern": "[\\x20\\x0A\\x0D\\x09]{1,24}"} at the schema's top level), or the
  text.
- `prompt_ids`: the first 16 ids of the checkpoint's fixture.json `ids` (the model's prompt;
  the matcher never sees it, as in the runtime).
- `greedy`: `ids`, the tokens generated (end id not included), each the first maximum of
  transformers' f32 last-position logits (weights bf16 -> f32) with the tokens the mask
  disallows at -inf; `ended`: "stopped" (the grammar had ended, its mask was the end id
  only, and the end id was taken), "eos" (an end id taken where the grammar could also go
  on) or "length" (MAX_NEW tokens generated); `near_tie_steps`: the steps whose two largest
  allowed logits are within 1e-4 (a runtime whose logits differ by float error may take
  the other one there).
- `paths`: paths[0] the greedy path, then N_SAMPLED paths choosing uniformly among the
  allowed tokens (numpy default_rng, seeds in `seed`). `ids` are the tokens taken,
  including the end id when one was; `masks[i]` is the mask ids[i] was chosen from, so
  len(masks) == len(ids) (a path cut at MAX_NEW tokens records no mask after its last).

Mask encoding: llguidance's bitmask, token i allowed iff bit i % 32 of u32 word i // 32 is
set; ceil(vocab_size / 32) words, each written as 8 lowercase hex digits of the word's value
(most significant digit first, i.e. "%08x"), concatenated in word order. A mask is
`Matcher::compute_mask_or_eos()`'s in the Rust crate: when the matcher is stopped, the end
id alone.

The tokenizer is llguidance.hf.from_tokenizer(PreTrainedTokenizerFast(tokenizer_file=...),
n_vocab=vocab_size, eos_token=end_ids) (toktrie_hf_tokenizers: byte-level pieces through
GPT-2's alphabet, special added tokens and any added token shaped <...> marked 0xFF, ids
past the tokenizer's up to vocab_size as never-produced special tokens). Where the grammar
forces bytes, llguidance's mask is the first token of their tokenization (a single token):
Python tokenizes them with the HF tokenizer, the runtime with the trie's greedy
longest-match. A second matcher here sees the same vocabulary with greedy tokenization (as
the runtime does); wherever its mask differs, `greedy_tokenize_masks` {step: mask} records
its mask (and `greedy.greedy_tokenize_ids` its greedy path, if that differs). With these
grammars and tokenizers that has not happened (the fields are absent), so the masks are
the runtime's expected masks as they stand.
"""
import argparse
import json
import os
import platform
import sys

import llguidance
import llguidance.hf
import numpy as np
import tokenizers
import torch
import transformers
from llguidance import LLMatcher, LLTokenizer
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "converter", "tests", "data")
CHECKPOINTS = ["tiny-llama3", "tiny-qwen2"]
PROMPT_LEN = 16
MAX_NEW = 48
N_SAMPLED = 3
NEAR_TIE = 1e-4
# runtime/src/text/grammar.rs's WHITESPACE, put in a schema's top level as `x-guidance`.
WHITESPACE = r"[\x20\x0A\x0D\x09]{1,24}"

GRAMMARS = [
    {"kind": "json_schema", "source": {
        "type": "object",
        "properties": {
            "color": {"type": "string", "enum": ["red", "green", "blue"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 99},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        },
        "required": ["color", "count", "tags"],
        "additionalProperties": False,
    }},
    {"kind": "json_schema", "source": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 10},
                    "age": {"type": "integer", "minimum": 0},
                },
                "required": ["name"],
            },
            "value": {"anyOf": [{"type": "number"}, {"type": "boolean"}, {"type": "null"},
                                {"type": "array", "items": {"type": "integer"}, "maxItems": 2}]},
        },
        "required": ["user", "value"],
    }},
    {"kind": "lark", "source": (
        'start: "yes" | "no" | WORD " " NUMBER\n'
        "WORD: /[a-z]{1,8}/\n"
        "NUMBER: /[0-9]{1,4}/\n"
    )},
    {"kind": "regex", "source": "[A-Z][a-z]{2,6}( [0-9]{1,3}){0,3}"},
    {"kind": "json_schema", "source": {"type": "object"}},
    {"kind": "json_schema", "source": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^[a-f0-9]{4}-[0-9]{2}$"},
            "day": {"type": "string", "format": "date"},
            "email": {"type": "string", "format": "email"},
        },
        "required": ["id", "day"],
        "additionalProperties": False,
    }},
    # Words the grammar forces after a choice: llguidance asks the tokenizer for their tokens.
    {"kind": "regex", "source": "x(the weather|call the tools)!"},
    # A tool call in the Hermes format, as runtime::text::tools::Format::grammar writes one.
    {"kind": "lark", "source": (
        'start: call ("\\n" call)*\n'
        'call: "<tool_call>\\n" %json {"anyOf": [{"type": "object", "properties": '
        '{"name": {"const": "get_weather"}, "arguments": {"type": "object", "properties": '
        '{"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}, '
        '"required": ["name", "arguments"], "additionalProperties": false}], '
        '"x-guidance": {"whitespace_pattern": "[\\\\x20\\\\x0A\\\\x0D\\\\x09]{1,24}"}} '
        '"\\n</tool_call>"\n'
    )},
]


def grammar_text(grammar):
    """The grammar as LLMatcher takes it, built as runtime/src/text/grammar.rs builds it."""
    kind, source = grammar["kind"], grammar["source"]
    if kind == "json_schema":
        schema = source
        if isinstance(schema, dict) and "x-guidance" not in schema:
            schema = {**schema, "x-guidance": {"whitespace_pattern": WHITESPACE}}
        return LLMatcher.grammar_from_json_schema(schema)
    if kind == "lark":
        return LLMatcher.grammar_from_lark(source)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(source)
    raise ValueError(kind)


class GreedyTokenization:
    """A TokenizerWrapper for LLTokenizer: the same token bytes, but bytes tokenized by the
    trie's greedy longest-match, as the runtime's TokenizerEnv does."""

    def __init__(self, lltok, vocab_size, end_id):
        self.lltok = lltok
        self.eos_token_id = end_id
        self.bos_token_id = None
        self.tokens = [(b"\xff" if lltok.is_special_token(i) else b"") + lltok.decode_bytes([i])
                       for i in range(vocab_size)]
        self.special_token_ids = []
        self.is_tokenizer_wrapper = True

    def __call__(self, text):
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return self.lltok.greedy_tokenize(text)


def mask_words(matcher, vocab_size):
    words = np.frombuffer(matcher.compute_bitmask(), dtype="<u4")
    n = (vocab_size + 31) // 32
    assert not words[n:].any(), "bits past the vocabulary"
    return words[:n].copy()


def allowed_ids(words, vocab_size):
    bits = np.unpackbits(words.astype("<u4").view(np.uint8), bitorder="little")
    return np.nonzero(bits[:vocab_size])[0]


def hex_mask(words):
    return "".join("%08x" % int(w) for w in words)


def walk(ckpt, lltok, mirror_tok, grammar, choose, vocab_size, end_ids, tokenizer_size):
    """One path: masks each step, `choose(step, ids, words)` picks the token. Returns the
    path (ids, masks, greedy_tokenize_masks) and how it ended."""
    text = grammar_text(grammar)
    m = LLMatcher(lltok, text, log_level=0)
    g = LLMatcher(mirror_tok, text, log_level=0)
    assert not m.is_error(), m.get_error()
    assert not g.is_error(), g.get_error()
    ids, masks, mirror = [], [], {}
    ended = "length"
    while len(ids) < MAX_NEW:
        stopped = m.is_stopped()
        words = mask_words(m, vocab_size)
        gwords = mask_words(g, vocab_size)
        allowed = allowed_ids(words, vocab_size)
        assert len(allowed) > 0
        assert allowed.max() < tokenizer_size or set(allowed) <= set(end_ids), \
            f"{ckpt}: an id past the tokenizer allowed"
        if stopped:
            assert list(allowed) == [end_ids[0]], allowed
        masks.append(hex_mask(words))
        if not np.array_equal(words, gwords):
            mirror[str(len(ids))] = hex_mask(gwords)
        token = int(choose(len(ids), ids, words, allowed))
        assert token in allowed
        ids.append(token)
        if token in end_ids:
            ended = "stopped" if stopped else "eos"
            break
        assert m.consume_token(token), m.get_error()
        assert g.consume_token(token), g.get_error()
    return ids, masks, mirror, ended


def greedy(model, prompt, lltok, mirror_tok, grammar, vocab_size, end_ids, tokenizer_size,
           use_mirror=False, ckpt=""):
    near_ties = []

    def choose(step, ids, words, allowed):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, -1].float().numpy()
        assert logits.shape == (vocab_size,)
        masked = np.full(vocab_size, -np.inf, dtype=np.float32)
        masked[allowed] = logits[allowed]
        if len(allowed) > 1:
            top = np.sort(masked[allowed])[-2:]
            if top[1] - top[0] <= NEAR_TIE:
                near_ties.append(step)
        return int(np.argmax(masked))  # the first maximum

    if use_mirror:
        lltok = mirror_tok
    ids, masks, mirror, ended = walk(ckpt, lltok, mirror_tok, grammar, choose, vocab_size,
                                     end_ids, tokenizer_size)
    return ids, masks, mirror, ended, near_ties


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output", help="where to write grammar-reference.json")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cases = []
    for ci, ckpt in enumerate(CHECKPOINTS):
        d = os.path.join(DATA, ckpt)
        config = json.load(open(os.path.join(d, "config.json")))
        gen = json.load(open(os.path.join(d, "generation_config.json")))
        fixture = json.load(open(os.path.join(d, "fixture.json")))
        vocab_size = config["vocab_size"]
        end_ids = gen["eos_token_id"]
        end_ids = list(end_ids) if isinstance(end_ids, list) else [end_ids]
        prompt = fixture["ids"][:PROMPT_LEN]

        hf_tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"))
        tokenizer_size = hf_tok.backend_tokenizer.get_vocab_size(with_added_tokens=True)
        lltok = llguidance.hf.from_tokenizer(hf_tok, n_vocab=vocab_size, eos_token=end_ids)
        assert lltok.vocab_size == vocab_size
        assert list(lltok.eos_tokens) == end_ids, (lltok.eos_tokens, end_ids)
        if len(end_ids) > 1:
            raise SystemExit("several end ids: GreedyTokenization takes one; extend it")
        mirror_tok = LLTokenizer(GreedyTokenization(lltok, vocab_size, end_ids[0]))

        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()

        for gi, grammar in enumerate(GRAMMARS):
            ids, masks, mirror, ended, near_ties = greedy(
                model, prompt, lltok, mirror_tok, grammar, vocab_size, end_ids,
                tokenizer_size, ckpt=ckpt)
            path = {"ids": ids, "masks": masks}
            if mirror:
                path["greedy_tokenize_masks"] = mirror
            out_ids = ids[:-1] if ended in ("eos", "stopped") else ids
            g = {"ids": out_ids, "ended": ended, "near_tie_steps": near_ties}
            if mirror:
                gids, _, _, gended, _ = greedy(
                    model, prompt, lltok, mirror_tok, grammar, vocab_size, end_ids,
                    tokenizer_size, use_mirror=True, ckpt=ckpt)
                if gids != ids:
                    g["greedy_tokenize_ids"] = gids[:-1] if gended in ("eos", "stopped") else gids
            paths = [path]
            for pi in range(N_SAMPLED):
                seed = 1000 * ci + 10 * gi + pi
                rng = np.random.default_rng(seed)
                sids, smasks, smirror, _ = walk(
                    ckpt, lltok, mirror_tok, grammar,
                    lambda step, ids, words, allowed: allowed[rng.integers(len(allowed))],
                    vocab_size, end_ids, tokenizer_size)
                p = {"seed": seed, "ids": sids, "masks": smasks}
                if smirror:
                    p["greedy_tokenize_masks"] = smirror
                paths.append(p)
            cases.append({
                "checkpoint": ckpt, "end_ids": end_ids, "vocab_size": vocab_size,
                "grammar": grammar, "prompt_ids": prompt, "greedy": g, "paths": paths,
            })
            print(f"{ckpt} {grammar['kind']:11} greedy {ended:7} {len(out_ids):2} tokens "
                  f"{lltok.decode_bytes(out_ids)!r} near ties {near_ties} "
                  f"sampled {[len(p['ids']) for p in paths[1:]]}"
                  + (" GREEDY-TOKENIZATION DIFFERS" if any('greedy_tokenize_masks' in p for p in paths) else ""),
                  file=sys.stderr)

    made_by = {
        "script": "scripts/make_grammar_reference.py",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "llguidance": llguidance.__version__ if hasattr(llguidance, "__version__")
        else llguidance.get_version() if hasattr(llguidance, "get_version") else "?",
        "tokenizer": "llguidance.hf.from_tokenizer(PreTrainedTokenizerFast(tokenizer_file="
                     "tokenizer.json), n_vocab=vocab_size, eos_token=end_ids)",
        "matcher": "LLMatcher(tokenizer, LLMatcher.grammar_from_json_schema|grammar_from_lark|"
                   "grammar_from_regex(source), log_level=0); masks compute_bitmask()",
        "mask_encoding": "ceil(vocab_size/32) u32 words, each '%08x', concatenated; "
                         "token i allowed iff bit i%32 of word i//32",
        "whitespace_pattern": WHITESPACE,
        "max_new_tokens": MAX_NEW,
        "near_tie": NEAR_TIE,
    }
    with open(args.output, "w") as f:
        json.dump({"made_by": made_by, "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", args.output, os.path.getsize(args.output), "bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
