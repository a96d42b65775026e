#!/usr/bin/env python3
"""llama.cpp's side of `bench --gguf`: the figures the runtime's bench child measures, taken
the same way with llama-cpp-python on a GGUF, printed as one JSON line.

Same tokens as runtime/src/bin/bench.rs (fixed ids spread over the vocabulary): pp128 and
pp512 (each prompt in one call, fresh context), tg128 (128 single-token calls after `depth`
prompt tokens, the token fed being the next fixed id: llama.cpp's speed does not depend on
which), load (process start to model ready) and peak RSS of this process.

usage: llamacpp_bench.py MODEL.gguf THREADS DEPTH
"""
import json
import resource
import sys
import time

started = time.perf_counter()
from llama_cpp import Llama  # noqa: E402  (import time counts as load, as ours does)

path, threads, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=path, n_ctx=max(512, depth + 128) + 8, n_threads=threads,
            n_threads_batch=threads, n_batch=512, verbose=False, use_mmap=True)
load_s = time.perf_counter() - started


def tokens(n):
    return [(i * 7919) % 40000 + 100 for i in range(n)]


def prefill(n):
    llm.reset()
    llm._ctx.kv_cache_clear()
    t = time.perf_counter()
    llm.eval(tokens(n))
    return n / (time.perf_counter() - t)


pp128, pp512 = prefill(128), prefill(512)
llm.reset()
llm._ctx.kv_cache_clear()
if depth:
    llm.eval(tokens(depth))
t = time.perf_counter()
for token in tokens(128):
    llm.eval([token])
tg128 = 128 / (time.perf_counter() - t)
peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"load_s": load_s, "pp128": pp128, "pp512": pp512, "tg128": tg128,
                  "peak_rss_mb": peak_rss_mb, "bytes_per_token": None}))
