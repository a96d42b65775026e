#!/usr/bin/env python3
"""llama.cpp's side of `bench --draft ngram`: greedy decoding of a prompt's answer, plain and
with llama-cpp-python's prompt-lookup decoding (`LlamaPromptLookupDecoding`, its defaults:
n-grams of up to 2 tokens, 10 tokens drafted), through the high-level `Llama` API that offers
it. The prompt comes as token ids (the bench's chat template, rendered by our tokenizer), so
both engines start from the same tokens.

Decode time is the completion's wall time less the prompt's: the prompt alone is evaluated
first (timed, then the context reset), and the completion then runs it again; llama.cpp's
own counters do not separate a drafted batch from a prompt.

usage: llamacpp_lookup.py MODEL.gguf THREADS MAX_TOKENS PROMPT_IDS plain|lookup
  (PROMPT_IDS: the prompt's token ids, a JSON list)
  -> one JSON line: {"tokens", "decode_s", "decode_tok_s", "mode"}
"""
import json
import sys
import time

from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

path, threads, max_tokens, ids, mode = sys.argv[1:6]
threads, max_tokens = int(threads), int(max_tokens)
prompt = json.loads(ids)
draft = LlamaPromptLookupDecoding() if mode == "lookup" else None
llm = Llama(model_path=path, n_ctx=len(prompt) + max_tokens + 64, n_threads=threads,
            n_threads_batch=threads, n_batch=512, draft_model=draft, verbose=False)

t = time.perf_counter()
llm.eval(prompt)
prompt_s = time.perf_counter() - t
llm.reset()

t = time.perf_counter()
answer = llm.create_completion(prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                               top_k=1, repeat_penalty=1.0)
total_s = time.perf_counter() - t
tokens = answer["usage"]["completion_tokens"]
decode_s = total_s - prompt_s
print(json.dumps({"tokens": tokens, "decode_s": decode_s,
                  "decode_tok_s": (tokens - 1) / decode_s, "mode": mode}))
