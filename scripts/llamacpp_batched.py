#!/usr/bin/env python3
"""llama.cpp's side of `bench --streams`: N sequences, each with its own 16-token prompt,
decoded together one token each per llama_decode call (what llama-server's parallel slots
do), with llama-cpp-python's low-level API; the prompts go in one call, whose time is
every sequence's time to first token (ttft_s). Same tokens as `bench --streams`: prompt ids
(i * 7919) % 40000 + 100 (+ s for sequence s), then (step * 31 + s * 17) % 40000 + 100.
With TEMPERATURE (`bench --streams --temperature`), each step feeds each sequence the token
its own sampler draws from its logits instead: llama-server's default chain (top-k 40,
top-p 0.95, min-p 0.05, then the temperature and a seeded draw), what a client that sends
only `temperature` gets; end-of-text is not special (llama-bench's way).

usage: llamacpp_batched.py MODEL.gguf THREADS STREAMS TG [TEMPERATURE] -> one JSON line

The run is a child of this process: llama-cpp-python 0.3.36 on a CPU with AMX crashes
(SIGSEGV) on a batch of tokens over a quantized GGUF, in the AMX kernels its weight repacking
selects (ggml-org/llama.cpp#20824; see llamacpp_bench.py). When the child dies, the run is
repeated with `use_extra_bufts` off (`plain`: no repacking, slower than llama.cpp can be),
and the JSON says `"repacked": false`.
"""
import json
import subprocess
import sys
import time

import llama_cpp as L

path, threads, streams, tg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
temperature = sys.argv[5] if len(sys.argv) > 5 else "-"
mode = sys.argv[6] if len(sys.argv) > 6 else None
if mode is None:
    for kind in ("repacked", "plain"):
        run = subprocess.run([sys.executable, __file__, *sys.argv[1:5], temperature, kind],
                             capture_output=True, text=True)
        if run.returncode == 0:
            print(run.stdout.strip().splitlines()[-1])
            sys.exit(0)
    sys.exit(f"llama.cpp crashed, with and without repacking: {run.stderr.strip()[-300:]}")
model_params = L.llama_model_default_params()
model_params.use_extra_bufts = mode == "repacked"
L.llama_backend_init()
model = L.llama_model_load_from_file(path.encode(), model_params)
params = L.llama_context_default_params()
params.n_ctx = streams * (tg + 64)
params.n_batch = params.n_ubatch = 512
params.n_seq_max = streams
params.n_threads = params.n_threads_batch = threads
ctx = L.llama_init_from_model(model, params)
batch = L.llama_batch_init(512, 0, streams)
samplers = []
if temperature != "-":
    for s in range(streams):
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(40))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(0.95, 1))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(0.05, 1))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(float(temperature)))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(s))
        samplers.append(chain)


def add(token, position, sequence, logits):
    i = batch.n_tokens
    batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, position, 1
    batch.seq_id[i][0], batch.logits[i] = sequence, logits
    batch.n_tokens += 1


prompt = [(i * 7919) % 40000 + 100 for i in range(16)]
batch.n_tokens = 0
for s in range(streams):
    for j, t in enumerate(prompt):
        add(t + s, j, s, j == len(prompt) - 1)
prompts_started = time.perf_counter()
if L.llama_decode(ctx, batch) != 0:
    sys.exit("llama_decode failed on the prompts")
# Every sequence's first logits come with this one call: its time is each one's TTFT.
ttft_s = time.perf_counter() - prompts_started
started = time.perf_counter()
# The batch index of each sequence's logits: its prompt's last token, then its own token.
last = [len(prompt) * (s + 1) - 1 for s in range(streams)]
for step in range(tg):
    if samplers:
        fed = [L.llama_sampler_sample(samplers[s], ctx, last[s]) for s in range(streams)]
    else:
        fed = [(step * 31 + s * 17) % 40000 + 100 for s in range(streams)]
    last = list(range(streams))
    batch.n_tokens = 0
    for s in range(streams):
        add(fed[s], len(prompt) + step, s, True)
    if L.llama_decode(ctx, batch) != 0:
        sys.exit(f"llama_decode failed at step {step}")
elapsed = time.perf_counter() - started
print(json.dumps({"streams": streams, "aggregate_tok_s": streams * tg / elapsed,
                  "ttft_s": ttft_s, "repacked": mode == "repacked",
                  "sampled": bool(samplers)}))
