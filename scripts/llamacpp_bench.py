#!/usr/bin/env python3
"""llama.cpp's side of `bench --gguf`: the figures the runtime's bench child measures, taken
the same way with llama-cpp-python on a GGUF, printed as one JSON line.

Same tokens as cli/src/bin/bench/main.rs (fixed ids spread over the vocabulary): pp128 and
pp512 (each prompt in one call, fresh context), tg128 (128 single-token calls after `depth`
prompt tokens, the token fed being the next fixed id: llama.cpp's speed does not depend on
which), load (process start to model ready) and peak RSS of this process.

usage: llamacpp_bench.py MODEL.gguf THREADS DEPTH [prefill | prefill-plain]

Prompts are run in a child process (the `prefill` mode): llama-cpp-python 0.3.36 on a CPU
with AMX crashes (SIGSEGV) in a prompt over a quantized GGUF, in the AMX kernels its weight
repacking ("extra buffer types") selects (ggml-org/llama.cpp#20824). When that child dies,
prompts are measured again with `use_extra_bufts` off (`prefill-plain`: no repacking, so
slower than llama.cpp can be, and the JSON says `"prefill_repacked": false`). Decoding one
token never crashes and is measured with the defaults, repacked weights included. A depth
over 0 needs a prompt in the decoding process too, so it runs with repacking off if the
prompt child crashed.
"""
import json
import os
import resource
import subprocess
import sys
import time

started = time.perf_counter()
import llama_cpp.llama_cpp as llama_cpp_lib  # noqa: E402  (import time counts as load)
from llama_cpp import Llama  # noqa: E402

import_s = time.perf_counter() - started

path, threads, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "all"


def without_repacking():
    default = llama_cpp_lib.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_cpp_lib.llama_model_default_params = params


if mode == "prefill-plain" or os.environ.get("LLAMACPP_PLAIN") == "1":
    without_repacking()


def load():
    return Llama(model_path=path, n_ctx=max(512, depth + 128) + 8, n_threads=threads,
                 n_threads_batch=threads, n_batch=512, verbose=False, use_mmap=True)


def tokens(n):
    return [(i * 7919) % 40000 + 100 for i in range(n)]


def prefill(llm, n):
    llm.reset()
    llm._ctx.kv_cache_clear()
    t = time.perf_counter()
    llm.eval(tokens(n))
    return n / (time.perf_counter() - t)


if mode in ("prefill", "prefill-plain"):
    llm = load()
    print(json.dumps({"pp128": prefill(llm, 128), "pp512": prefill(llm, 512)}))
    sys.exit(0)

# The prompts first, in a child: a crash there must not take the decoding run with it.
def child(kind):
    run = subprocess.run([sys.executable, __file__, path, str(threads), str(depth), kind],
                         capture_output=True, text=True)
    return json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else None


prompts, repacked = child("prefill"), True
if prompts is None:
    prompts, repacked = child("prefill-plain"), False
    if prompts is None:
        sys.exit("llama.cpp crashed in a prompt, with and without repacking")
    if depth:
        without_repacking()

started_load = time.perf_counter()
llm = load()
load_s = import_s + time.perf_counter() - started_load
llm.reset()
llm._ctx.kv_cache_clear()
if depth:
    llm.eval(tokens(depth))
t = time.perf_counter()
for token in tokens(128):
    llm.eval([token])
tg128 = 128 / (time.perf_counter() - t)
peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"load_s": load_s, "pp128": prompts["pp128"], "pp512": prompts["pp512"],
                  "tg128": tg128, "peak_rss_mb": peak_rss_mb, "bytes_per_token": None,
                  "prefill_repacked": repacked}))
